"""Benchmarks: run each from the repository root as ``python -m bench.NAME`` (they import ``testbed``)."""
