"""Where each upstream's controller starts: the sweet spot of a ``sweetspot sweep`` result (``--sweep-result``).

The sweep's JSON file is the contract between the two tools, so this reads it with the sweep's own schema
(:mod:`gateway.sweep.result`, pydantic only): the one module of the tools the server imports.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from gateway.control.config import StartPoint
from gateway.sweep.result import SweepResult, load_sweep_result

log = logging.getLogger("sweetspot.controller")


def start_point(result: SweepResult) -> StartPoint | None:
    """The start point a sweep measured (None when it found no sweet spot). Levels past the peak (a cliff)
    or with failed requests are left out: the curve the controller keeps is the part below the cliff,
    where throughput never falls as concurrency rises."""
    spot = result.sweet_spot
    if spot is None:
        return None
    top = result.peak_concurrency
    levels = tuple(
        sorted(
            (level.concurrency, level.output_tokens_per_s)
            for level in result.levels
            if level.output_tokens_per_s > 0 and not level.failed and (top is None or level.concurrency <= top)
        )
    )
    return StartPoint(limit=spot.concurrency, peak_tokens_per_s=result.peak_tokens_per_s, levels=levels)


def load_start_points(path: Path | None, upstreams: Sequence[str]) -> dict[str, StartPoint]:
    """Start points from a sweep result file: for the upstream the sweep measured, else for every upstream."""
    if path is None:
        return {}
    result = load_sweep_result(path)
    start = start_point(result)
    if start is None:
        log.warning("sweep result %s found no sweet spot; starting at initial_limit", path)
        return {}
    swept = str(result.server.url).rstrip("/")
    chosen = [swept] if swept in upstreams else list(upstreams)
    log.info(
        "starting %s at the sweet spot %d from %s (peak %.0f tokens/s)",
        ", ".join(chosen),
        start.limit,
        path,
        start.peak_tokens_per_s or 0,
    )
    return {name: start for name in chosen}
