"""Load generation and the concurrency sweep: measure a server, find its sweet spot, report it.

Public API (the demo and ``sweetspot serve`` build on these; none of it imports the gateway server):

- :func:`run_sweep` / :func:`run_sweep_sync` with a :class:`SweepConfig` -> :class:`SweepResult`;
  pass ``progress=`` a callable receiving :class:`SweepEvent` for live updates.
- :func:`load_sweep_result` reads and validates a ``sweep.json``; :func:`write_report` writes one.
- :class:`ClosedLoopPool` / :class:`PoissonLoad`: load generators whose concurrency (and rate) can
  change while they run, reporting :class:`RequestRecord` per request and :class:`PoolStats` live.
- :func:`find_sweet_spot`, :func:`level_metrics`: the pure finder and metric definitions.
"""

from __future__ import annotations

import importlib
from typing import Any

# Lazy: ``sweetspot serve`` imports ``gateway.bench.result`` to read a sweep, and should not pay for
# aiohttp, numpy and rich to do so.
_EXPORTS = {
    "RequestRecord": "client", "StreamClient": "client", "Target": "client",
    "detect_cliff": "finder", "find_sweet_spot": "finder",
    "LiveStats": "live", "LiveWindow": "live",
    "ClosedLoopPool": "loadgen", "PoissonLoad": "loadgen", "PoolStats": "loadgen",
    "level_metrics": "metrics",
    "write_report": "report",
    "SLO": "result", "LevelMetrics": "result", "SweepResult": "result", "SweepResultError": "result",
    "load_sweep_result": "result", "save_sweep_result": "result",
    "DEFAULT_LEVELS": "sweep", "SweepConfig": "sweep", "SweepError": "sweep", "SweepEvent": "sweep",
    "run_sweep": "sweep", "run_sweep_sync": "sweep",
    "LengthDist": "workload", "RequestFactory": "workload", "Workload": "workload", "parse_length": "workload",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
