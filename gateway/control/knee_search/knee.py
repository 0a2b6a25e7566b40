"""Three questions the knee search asks of the measured curve: how big a step is, where to sit, and
whether a step up paid.

They are pure functions of the curve, the config and the limit, kept apart from the state machine in
:mod:`gateway.control.knee_search.aimd` (which decides *when* to step and measure) so that the rules judging a
measurement read on their own, as :mod:`gateway.control.knee_search.capacity` does for the KV room.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.control.config import AimdConfig
from gateway.control.knee_search.curve import Curve

CLIMB_STEP = 0.25  # climb steps are a quarter of the limit: a step's gain must stand out of the noise
KNEE_DEAD_BAND = 0.05  # the knee must move by more than this share of the limit to move the limit


def probe_step(config: AimdConfig, limit: int) -> int:
    """One re-probe step beside ``limit``: grows as its square root, so a probe costs a similar share
    of throughput at any size, and never less than one slot."""
    return max(1, round(config.probe_step_scale * math.sqrt(limit)))


def knee_target(curve: Curve, config: AimdConfig, limit: int, lo: int, top: int) -> int | None:
    """Where the curve says to sit, or None to stay: the knee plus ``knee_margin``, never past
    the highest measured limit (exploring up is the climb's job). When even the lowest measured
    limit reaches the knee's throughput, the knee may lie lower: step down a quarter to find out.
    A dead band of a few percent keeps reading-to-reading noise from moving the limit."""
    found = curve.knee(config.knee_fraction)
    if found is None:
        return None
    knee, bracketed = found
    if bracketed:
        knee = math.ceil(knee * (1 + config.knee_margin) - 1e-9)
    elif knee > lo:
        return max(lo, math.floor(knee * (1 - CLIMB_STEP)))
    knee = min(max(knee, lo), top, max(curve.points))
    if abs(knee - limit) <= round(KNEE_DEAD_BAND * limit) and limit <= top:
        return None
    return knee


def paid(
    curve: Curve,
    config: AimdConfig,
    base_limit: int,
    limit: int,
    rate: float,
) -> tuple[bool, dict[str, Any]]:
    """Whether the added slots earned at least ``marginal_gain_min`` of the average per-slot
    throughput below them (the base's rate is the curve's pooled reading, not one sample), and the
    numbers it was judged on for the decision log (empty when there was nothing to compare)."""
    base_rate = curve.rate(base_limit)
    if base_rate is None or limit <= base_limit:
        return False, {}
    marginal = (rate - base_rate) / (limit - base_limit)
    average = base_rate / base_limit
    detail: dict[str, Any] = dict(
        base_limit=base_limit,
        base_tokens_per_s=round(base_rate, 2),
        marginal_per_slot=round(marginal, 3),
        average_per_slot=round(average, 3),
    )
    if base_rate <= 0:
        return rate > 0, detail
    return marginal >= config.marginal_gain_min * average, detail


def clearly_below(curve: Curve, config: AimdConfig, low: int, high: int) -> bool:
    """Whether ``low`` measures clearly under the knee against ``high``: its pooled throughput is under
    ``knee_fraction`` of ``high``'s by more than the curve's shift (the deviation it calls a change of
    the world), so no reading short of such a change could put the knee at or below ``low``."""
    low_rate, high_rate = curve.rate(low), curve.rate(high)
    if low_rate is None or high_rate is None or not curve.settled(low) or high_rate <= 0:
        return False
    return low_rate < config.knee_fraction * (1 - curve.shift) * high_rate
