"""The sweet spot each phase is judged against: the sweep's, or what the slowed backend can achieve.

The sweep measured the backend at its normal speed. When the demo slows the simulator down by a factor
``f`` (every engine step takes ``f`` times as long), the same concurrency delivers ``1/f`` of the tokens
per second and every latency grows ``f``-fold. So the levels the sweep measured, rescaled that way, are
what a sweep of the slowed backend would find, and the same finder (same fraction of peak, same SLOs)
gives the sweet spot achievable then. The shape of the curve does not change, so the concurrency only
moves if a level stops meeting an objective; this module makes that explicit instead of assuming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.sweep.finder import find_sweet_spot, judge
from gateway.sweep.result import LevelMetrics, Stats, SweepResult


@dataclass(frozen=True, slots=True)
class Reference:
    concurrency: int | None
    tokens_per_s: float | None  # at the reference concurrency, wall clock
    source: str  # how it was obtained, for the summary


def _scale_stats(stats: Stats, factor: float) -> Stats:
    updates = {
        name: getattr(stats, name) * factor
        for name in ("mean", "p50", "p90", "p99")
        if getattr(stats, name) is not None
    }
    return stats.model_copy(update=updates)


def slowed_level(level: LevelMetrics, factor: float) -> LevelMetrics:
    """``level`` as it would measure on a backend whose every step takes ``factor`` times as long."""
    return level.model_copy(
        update={
            "output_tokens_per_s": level.output_tokens_per_s / factor,
            "requests_per_s": level.requests_per_s / factor,
            "goodput_requests_per_s": None,
            "ttft_ms": _scale_stats(level.ttft_ms, factor),
            "tpot_ms": _scale_stats(level.tpot_ms, factor),
            "itl_ms": _scale_stats(level.itl_ms, factor),
            "e2e_ms": _scale_stats(level.e2e_ms, factor),
        }
    )


def reference_for(result: SweepResult, speed_factor: float = 1.0) -> Reference:
    """The sweet spot to judge a phase against, for a backend slowed by ``speed_factor``."""
    if speed_factor == 1.0:
        spot = result.sweet_spot
        return Reference(
            concurrency=spot.concurrency if spot else None,
            tokens_per_s=spot.output_tokens_per_s if spot else None,
            source="the sweep's sweet spot" if spot else f"the sweep found no sweet spot ({result.verdict})",
        )
    settings = result.settings
    levels = [judge(slowed_level(level, speed_factor), settings.slo) for level in result.levels]
    verdict = find_sweet_spot(
        levels,
        slo=settings.slo,
        fraction=settings.fraction,
        tolerance=settings.cliff_tolerance,
        max_error_rate=settings.max_error_rate,
    )
    spot = verdict.sweet_spot
    source = (
        f"the sweep re-judged at {speed_factor:g}x step time (tokens/s / {speed_factor:g}, "
        f"latencies x {speed_factor:g}, same SLOs)"
    )
    if spot is None:
        source += f": no sweet spot ({verdict.reason})"
    return Reference(
        concurrency=spot.concurrency if spot else None,
        tokens_per_s=spot.output_tokens_per_s if spot else None,
        source=source,
    )


def backend_requests_per_s(result: SweepResult) -> float | None:
    """The most requests/s one backend completed at a sweep level within the objectives: what the elastic
    phases' arrivals are a multiple of. The best level rather than the sweet spot's, since the controller may
    hold a little above the sweet spot and deliver that much; None when no level met the objectives."""
    rates = [level.requests_per_s for level in result.levels if level.slo_met and level.requests_per_s > 0]
    return max(rates) if rates else None
