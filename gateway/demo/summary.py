"""Where the controller held in each phase, against the sweet spot that phase should have. Pure.

Per phase, only its *steady* part counts: the first ``STEADY_SKIP`` of a phase is the transition the
change of load (or of backend speed) causes. A phase is judged only when its clients exceed the
reference sweet spot by ``DEMAND_MARGIN``; with fewer clients the limit is not what bounds the
backend, so the controller holding anywhere above the demand is right and the number proves nothing.
Judged: the median limit over the steady part within ``TOLERANCE`` of the reference.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gateway.demo.reference import Reference
from gateway.demo.script import DEMAND_MARGIN, STEADY_SKIP, TOLERANCE, Phase, is_judged
from gateway.demo.timeline import Sample

PASS, MISS, NOT_JUDGED, NO_DATA = "within", "outside", "not judged", "no data"


@dataclass(frozen=True, slots=True)
class PhaseSummary:
    name: str
    clients: int
    speed_factor: float
    start_s: float
    end_s: float
    steady_from_s: float
    samples: int
    reference: int | None
    reference_source: str
    judged: bool
    verdict: str  # PASS, MISS, NOT_JUDGED or NO_DATA
    ratio: float | None  # median limit / reference
    limit_median: float | None
    limit_min: int | None
    limit_max: int | None
    in_band: float | None  # share of steady samples with the limit within the tolerance band
    inflight_median: float | None
    queued_median: float | None
    tokens_per_s_median: float | None
    tpot_p99_ms_median: float | None
    kv_usage_max: float | None
    preemptions: int | None  # the backend's preemptions during the phase
    failed: int  # client requests that failed during the phase
    rejected: int  # ... that the gateway refused (429/503)
    note: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median(values: Sequence[float | int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def _delta(first: int | None, last: int | None) -> int | None:
    return None if first is None or last is None else last - first


def phase_bounds(phases: Sequence[Phase]) -> list[tuple[float, float]]:
    """(start, end) of each phase in seconds since the load began, by their planned durations."""
    bounds, t = [], 0.0
    for phase in phases:
        bounds.append((t, t + phase.duration_s))
        t += phase.duration_s
    return bounds


def summarize_phase(
    index: int, phase: Phase, samples: Sequence[Sample], reference: Reference, previous: Sample | None = None
) -> PhaseSummary:
    """One phase's summary from its samples (all of them, in time order)."""
    mine = [s for s in samples if s.phase == index]
    start = mine[0].t if mine else 0.0
    end = mine[-1].t if mine else 0.0
    steady_from = start + STEADY_SKIP * (end - start)
    steady = [s for s in mine if s.t >= steady_from]
    limits = [s.limit for s in steady if s.limit is not None]
    ref = reference.concurrency
    judged = is_judged(phase.clients, ref)
    median = _median(limits)
    ratio = median / ref if median is not None and ref else None
    in_band = (sum(1 for v in limits if abs(v / ref - 1) <= TOLERANCE) / len(limits)) if limits and ref else None
    if not limits:
        verdict, note = NO_DATA, "no limit was read during the phase's steady part"
    elif judged:
        verdict = PASS if ratio is not None and abs(ratio - 1) <= TOLERANCE else MISS
        note = (
            f"{phase.clients} clients > {DEMAND_MARGIN:g} x {ref}: the limit is the bottleneck; "
            f"median limit {median:g} is {ratio:.2f} x the reference"
        )
    else:
        verdict = NOT_JUDGED
        queued = _median([s.queued for s in steady]) or 0
        if ref is None:
            note = "no reference sweet spot to judge against"
        elif median is not None and median < phase.clients and queued > 0:
            # Not the criterion (demand is under the sweet spot), but worth saying: the limit throttled
            # a demand the backend could have taken.
            note = (
                f"{phase.clients} clients < {DEMAND_MARGIN:g} x {ref}, yet the limit (median {median:g}) "
                f"sat below the demand: a median of {queued:g} requests queued in the gateway"
            )
        else:
            inflight = _median([s.inflight for s in steady])
            note = (
                f"{phase.clients} clients < {DEMAND_MARGIN:g} x {ref}: demand, not the limit, bounds "
                f"the backend (in-flight median {'-' if inflight is None else f'{inflight:g}'})"
            )
    before = previous if previous is not None else (mine[0] if mine else None)
    last = mine[-1] if mine else None
    return PhaseSummary(
        name=phase.name,
        clients=phase.clients,
        speed_factor=phase.speed_factor,
        start_s=round(start, 2),
        end_s=round(end, 2),
        steady_from_s=round(steady_from, 2),
        samples=len(steady),
        reference=ref,
        reference_source=reference.source,
        judged=judged,
        verdict=verdict,
        ratio=None if ratio is None else round(ratio, 3),
        limit_median=median,
        limit_min=min(limits) if limits else None,
        limit_max=max(limits) if limits else None,
        in_band=None if in_band is None else round(in_band, 3),
        inflight_median=_median([s.inflight for s in steady]),
        queued_median=_median([s.queued for s in steady]),
        tokens_per_s_median=_median([s.tokens_per_s for s in steady]),
        tpot_p99_ms_median=_median([s.tpot_p99_ms for s in steady]),
        kv_usage_max=max((s.kv_usage for s in mine if s.kv_usage is not None), default=None),
        preemptions=_delta(before.preemptions, last.preemptions) if before and last else None,
        failed=(last.failed - before.failed) if before and last else 0,
        rejected=(last.rejected - before.rejected) if before and last else 0,
        note=note,
    )


def summarize(
    phases: Sequence[Phase], samples: Sequence[Sample], references: Sequence[Reference]
) -> list[PhaseSummary]:
    """Every phase that has samples (an interrupted demo summarises the phases it reached)."""
    out: list[PhaseSummary] = []
    previous: Sample | None = None
    for index, (phase, reference) in enumerate(zip(phases, references, strict=True)):
        if not any(s.phase == index for s in samples):
            break
        out.append(summarize_phase(index, phase, samples, reference, previous))
        previous = [s for s in samples if s.phase == index][-1]
    return out


def overall(summaries: Sequence[PhaseSummary]) -> bool | None:
    """True when every judged phase held within the tolerance; None when no phase was judged."""
    judged = [s for s in summaries if s.judged and s.verdict != NO_DATA]
    if not judged:
        return None
    return all(s.verdict == PASS for s in judged)
