"""From measured levels to the answer: the peak, the sweet spot and the cliff. Pure functions.

- Peak: the highest output tokens/s of any level.
- Sweet spot: the *smallest* concurrency, before any cliff, whose tokens/s reach ``fraction`` of the
  peak while its p99 TTFT / TPOT / E2E hold their objectives and its error rate stays within bounds.
  Smallest, because past the knee more concurrency buys latency and KV-cache pressure, not throughput.
- Cliff: the first level, in rising concurrency, whose error rate exceeds ``max_error_rate`` or whose
  tokens/s fall more than ``tolerance`` below the best seen so far. The sweep stops there.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.sweep.result import SLO, Cliff, LevelMetrics, SweetSpot, Verdict


def slo_violations(level: LevelMetrics, slo: SLO) -> list[str]:
    """Why ``level`` fails its objectives at p99 (empty when it holds them all)."""
    if level.completed == 0:
        return ["no successful request"]
    out: list[str] = []
    for name, limit, stats in (
        ("TTFT", slo.ttft_ms, level.ttft_ms),
        ("TPOT", slo.tpot_ms, level.tpot_ms),
        ("E2E", slo.e2e_ms, level.e2e_ms),
    ):
        if limit is not None and stats.p99 is not None and stats.p99 > limit:
            out.append(f"p99 {name} {stats.p99:.0f} ms > {limit:g} ms")
    return out


def judge(level: LevelMetrics, slo: SLO) -> LevelMetrics:
    """``level`` with ``slo_met`` / ``slo_violations`` filled in."""
    violations = slo_violations(level, slo)
    return level.model_copy(update={"slo_met": not violations, "slo_violations": violations})


def detect_cliff(levels: Sequence[LevelMetrics], *, tolerance: float, max_error_rate: float) -> Cliff | None:
    """The first level (by concurrency) where errors appear or throughput falls off the best so far."""
    best: LevelMetrics | None = None
    for level in sorted(levels, key=lambda lv: lv.concurrency):
        if level.timed_out and level.completed == 0:
            return Cliff(
                concurrency=level.concurrency,
                kind="errors",
                reason=f"no request completed at concurrency {level.concurrency} within the level's time limit",
                output_tokens_per_s=level.output_tokens_per_s,
                best_before_concurrency=best.concurrency if best else None,
                best_before_tokens_per_s=best.output_tokens_per_s if best else None,
            )
        if level.error_rate > max_error_rate:
            return Cliff(
                concurrency=level.concurrency,
                kind="errors",
                reason=(
                    f"{level.error_rate:.0%} of requests failed at concurrency {level.concurrency} "
                    f"(allowed {max_error_rate:.0%})"
                ),
                output_tokens_per_s=level.output_tokens_per_s,
                best_before_concurrency=best.concurrency if best else None,
                best_before_tokens_per_s=best.output_tokens_per_s if best else None,
            )
        if best is not None and level.output_tokens_per_s < best.output_tokens_per_s * (1.0 - tolerance):
            drop = 1.0 - level.output_tokens_per_s / best.output_tokens_per_s
            return Cliff(
                concurrency=level.concurrency,
                kind="throughput_drop",
                reason=(
                    f"{level.output_tokens_per_s:.0f} tok/s at concurrency {level.concurrency} is {drop:.0%} "
                    f"below the best so far ({best.output_tokens_per_s:.0f} tok/s at {best.concurrency}; "
                    f"tolerance {tolerance:.0%})"
                ),
                output_tokens_per_s=level.output_tokens_per_s,
                best_before_concurrency=best.concurrency,
                best_before_tokens_per_s=best.output_tokens_per_s,
            )
        if best is None or level.output_tokens_per_s > best.output_tokens_per_s:
            best = level
    return None


def find_sweet_spot(
    levels: Sequence[LevelMetrics],
    *,
    slo: SLO,
    fraction: float = 0.9,
    tolerance: float = 0.10,
    max_error_rate: float = 0.01,
) -> Verdict:
    """Peak, sweet spot and cliff of a sweep, with a one-line reason a person can check."""
    ordered = sorted(levels, key=lambda lv: lv.concurrency)
    cliff = detect_cliff(ordered, tolerance=tolerance, max_error_rate=max_error_rate)
    usable = [lv for lv in ordered if lv.completed > 0]
    if not usable:
        return Verdict(
            peak_tokens_per_s=0.0,
            peak_concurrency=None,
            sweet_spot=None,
            cliff=cliff,
            reason="no level completed a single request",
        )
    peak = max(usable, key=lambda lv: lv.output_tokens_per_s)  # first maximum: the smallest concurrency
    target = fraction * peak.output_tokens_per_s
    before_cliff = [lv for lv in usable if cliff is None or lv.concurrency < cliff.concurrency]
    healthy = [lv for lv in before_cliff if lv.error_rate <= max_error_rate and not slo_violations(lv, slo)]
    for level in healthy:
        if level.output_tokens_per_s >= target:
            spot = SweetSpot(
                concurrency=level.concurrency,
                output_tokens_per_s=level.output_tokens_per_s,
                fraction_of_peak=level.output_tokens_per_s / peak.output_tokens_per_s,
                ttft_p99_ms=level.ttft_ms.p99,
                tpot_p99_ms=level.tpot_ms.p99,
            )
            reason = (
                f"concurrency {level.concurrency} reaches {spot.fraction_of_peak:.0%} of the peak "
                f"{peak.output_tokens_per_s:.0f} tok/s (at {peak.concurrency}) with every SLO held"
            )
            return Verdict(
                peak_tokens_per_s=peak.output_tokens_per_s,
                peak_concurrency=peak.concurrency,
                sweet_spot=spot,
                cliff=cliff,
                reason=reason,
            )
    if not healthy:
        first = before_cliff[0] if before_cliff else usable[0]
        problems = "; ".join(slo_violations(first, slo)) or f"error rate {first.error_rate:.0%}"
        reason = f"no level before the cliff met the SLOs (at concurrency {first.concurrency}: {problems})"
    else:
        best = max(healthy, key=lambda lv: lv.output_tokens_per_s)
        reason = (
            f"no level within the SLOs reached {fraction:.0%} of the peak {peak.output_tokens_per_s:.0f} tok/s; "
            f"the best within them was concurrency {best.concurrency} at {best.output_tokens_per_s:.0f} tok/s "
            f"({best.output_tokens_per_s / peak.output_tokens_per_s:.0%})"
        )
    return Verdict(
        peak_tokens_per_s=peak.output_tokens_per_s,
        peak_concurrency=peak.concurrency,
        sweet_spot=None,
        cliff=cliff,
        reason=reason,
    )
