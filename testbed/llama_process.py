"""Run llama-server as a child process for benchmarks and scripts: start it, wait until it serves, stop it.

Tests start servers through ``testbed`` (fixtures that stop them with the test); scripts in ``bench/``
use this module, with the same command line (:class:`~testbed.llama_server.LlamaServerConfig`),
the same process handling (:mod:`gateway.common.processes`) and the same readiness rule: llama-server
prints ``listening on http://...`` only once the model is loaded, and ``/health`` then answers 200.

:func:`start_near_free_server` runs a model so small that a decode step costs next to nothing: what a
benchmark of the *gateway* wants upstream, so that the proxy's own CPU, not the model, decides the numbers.
"""

from __future__ import annotations

from gateway.common.processes import LISTENING, RunningProcess, start_process
from testbed.llama_server import LlamaServerConfig, find_binary
from testbed.tiny_gguf import TinyModelSpec, ensure_model

#: 2 layers of width 64 (about 0.1M parameters with the 440-token vocabulary): a decode step takes
#: microseconds, so per-request costs are HTTP, JSON and scheduling, as for a gateway benchmark they must be.
NEAR_FREE_MODEL = TinyModelSpec(n_embd=64, n_layer=2, n_head=2, n_head_kv=2, n_ff=128)
NEAR_FREE_ALIAS = "near-free"


def start_server(config: LlamaServerConfig, *, timeout_s: float = 120.0) -> RunningProcess:
    """Start llama-server with ``config`` (``port=0``: it picks one) and return once it serves; a failure
    to start raises :class:`~gateway.common.processes.ProcessError` with the server's output."""
    return start_process(
        config.command(find_binary()), ready_pattern=LISTENING, ready_url="{url}/health", timeout=timeout_s
    )


def start_near_free_server(
    parallel: int = 32, *, threads: int = 1, ctx_per_slot: int = 512, http_threads: int | None = None
) -> tuple[RunningProcess, str]:
    """llama-server on :data:`NEAR_FREE_MODEL` with ``parallel`` slots; returns ``(process, url)``.

    One thread by default: on a 2-core machine a second ggml thread buys nothing for a model this small
    and would spin against the gateway being measured for the other core. ``http_threads``: llama-server
    serves each open connection on a thread of its own (``parallel`` + 2 of them by default), and an idle
    kept-alive connection holds its thread for seconds; several proxies' pools in front of one server
    need more than the default, or one's idle connections starve the next one's requests.
    """
    extra = ("--threads-http", str(http_threads)) if http_threads else ()
    config = LlamaServerConfig(
        model=ensure_model(NEAR_FREE_MODEL),
        port=0,
        parallel=parallel,
        ctx_per_slot=ctx_per_slot,
        threads=threads,
        alias=NEAR_FREE_ALIAS,
        extra=extra,
    )
    proc = start_server(config)
    return proc, proc.url
