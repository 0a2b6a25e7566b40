"""Test tooling the tests and the benchmarks share, never shipped: llama-server built from source and
served on a generated tiny GGUF model, vLLM's CPU build in its own virtualenv on a generated HF model,
the gateway and the simulator as child processes, Debian's redis-server, fault-injecting upstreams, and
the scenario harness (the controller against the simulator's engine on virtual time, with an oracle).

A package of its own, beside ``tests/`` and ``bench/``, so a benchmark imports no test module."""
