"""Judging a run by its outcomes: goodput within the objectives, and the oracle it is compared with.

The oracle answers "what would the best *static* limit have done here?" by simulating every static
limit in the same harness, under the same conditions and seed, and measuring each the same way the
controller's run is measured. Its sweet spot is the smallest static limit whose goodput is within
``SWEET_FRACTION`` of the best one (the definition the design notes give: the smallest concurrency
that gets nearly the peak while the objectives hold).

Goodput follows ``vllm bench serve``: a request counts only when it met every objective (here p99
objectives applied per request: TTFT net of the gateway's queue, and TPOT). It is reported in output
tokens/s, tokens spread evenly over each request's streaming time and counted inside the window.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cache

from gateway.control.config import AimdConfig
from gateway.control.window import Outcome, RequestSample, percentile
from gateway.sim.profiles import get_profile
from testbed.scenarios.harness import Conditions, Finished, Harness

SWEET_FRACTION = 0.97
STATIC_WARMUP_S = 20.0
STATIC_MEASURE_S = 40.0
STATIC_WARMUP_LIMIT_S = 300.0


def meets_slo(sample: RequestSample, config: AimdConfig) -> bool:
    if sample.outcome is not Outcome.OK or sample.upstream_ttft is None:
        return False
    if config.ttft_p99_slo_s is not None and sample.upstream_ttft > config.ttft_p99_slo_s:
        return False
    tpot = sample.tpot
    return not (config.tpot_p99_slo_s is not None and tpot is not None and tpot > config.tpot_p99_slo_s)


def tokens_in(sample: RequestSample, start: float, end: float) -> float:
    """Output tokens of ``sample`` streamed inside [start, end), spread evenly from first token to finish."""
    if sample.first_token is None or sample.output_tokens <= 0:
        return 0.0
    first, last = sample.first_token, sample.finished
    if last <= first:
        return float(sample.output_tokens) if start <= first < end else 0.0
    overlap = max(0.0, min(last, end) - max(first, start))
    return sample.output_tokens * overlap / (last - first)


def goodput(
    finished: Iterable[Finished], start: float, end: float, config: AimdConfig, gateway: int | None = None
) -> tuple[float, float]:
    """(goodput, throughput) in output tokens/s over [start, end), optionally for one gateway."""
    good = total = 0.0
    for item in finished:
        if gateway is not None and item.gateway != gateway:
            continue
        tokens = tokens_in(item.sample, start, end)
        total += tokens
        if tokens and meets_slo(item.sample, config):
            good += tokens
    span = max(end - start, 1e-9)
    return good / span, total / span


def tpot_p99(finished: Iterable[Finished], start: float, end: float) -> float | None:
    values = [
        f.sample.tpot
        for f in finished
        if start <= f.sample.finished < end and f.sample.outcome is Outcome.OK and f.sample.tpot is not None
    ]
    return percentile(values, 99)  # type: ignore[arg-type]


def ttft_p99(finished: Iterable[Finished], start: float, end: float) -> float | None:
    """p99 TTFT net of the gateway's queue (what the objective judges) of requests that finished in [start, end)."""
    values = [
        f.sample.upstream_ttft
        for f in finished
        if start <= f.sample.finished < end and f.sample.outcome is Outcome.OK and f.sample.upstream_ttft is not None
    ]
    return percentile(values, 99)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class StaticPoint:
    limit: int
    goodput: float
    tokens_per_s: float
    preemptions: int
    tpot_p99: float | None


@dataclass(frozen=True, slots=True)
class Oracle:
    points: tuple[StaticPoint, ...]
    best: StaticPoint
    sweet_spot: int  # smallest static limit with goodput >= SWEET_FRACTION x the best
    preemption_onset: int | None  # smallest static limit that preempted, if any

    def at(self, limit: int) -> StaticPoint | None:
        return next((p for p in self.points if p.limit == limit), None)


def static_point(profile_name: str, conditions: Conditions, config: AimdConfig, limit: int, seed: int) -> StaticPoint:
    """One static limit in steady state, total over every gateway.

    Clients start together, so the first requests run in step; the warm-up lasts until every slot
    has turned over twice (at least ``STATIC_WARMUP_S``), and the measurement at least as long, so a
    slow backend or long answers are measured in steady state too."""
    harness = Harness(
        get_profile(profile_name), config, gateways=len(conditions.clients), seed=seed, static_limit=limit
    )
    harness.run_phase(conditions, STATIC_WARMUP_S)
    while len(harness.trace.finished) < 2 * limit and harness.now < STATIC_WARMUP_LIMIT_S:
        harness.run_phase(conditions, 5.0)
    start = harness.now
    end = start + max(STATIC_MEASURE_S, start)
    harness.run_phase(conditions, end - start)
    finished = harness.trace.finished + harness.open_requests()
    good, total = goodput(finished, start, end, config)
    return StaticPoint(
        limit, good, total, harness.trace.preemptions_between(start, end), tpot_p99(finished, start, end)
    )


def _grid(demand: int, max_limit: int) -> list[int]:
    """Coarse levels: every limit up to 4, then steps of 2 to 16, steps of 4 to 128, then steps of 16."""
    top = min(max_limit, demand)
    levels = [*range(1, 5), *range(6, 17, 2), *range(20, min(top, 128) + 1, 4), *range(144, top + 1, 16)]
    return sorted({level for level in levels if level <= top} | {top})


def oracle(profile_name: str, conditions: Conditions, config: AimdConfig, seed: int, max_limit: int = 128) -> Oracle:
    """The static limits' goodput curve: a coarse pass up to the cliff, then every limit in between
    where the answer lies (below the coarse sweet spot, and around the best), so the sweet spot and the
    best are exact for any curve that rises smoothly to its peak.

    Conditions with several gateways are simulated as one gateway holding all their clients: the
    oracle is the best the *backend* can do. Only the objectives of ``config`` matter to it, and how the
    gateway sees the tokens (streamed or whole answers) does not: a static limit does not read them, and
    goodput is judged on what the backend did. Cached for the session (conditions are frozen values), so
    scenarios that share conditions share the work.
    """
    single = Conditions(
        clients=(sum(conditions.clients),),
        workload=replace(conditions.workload, streamed=1.0),
        speed_factor=conditions.speed_factor,
        error_rate=conditions.error_rate,
        metrics="live",
    )
    objectives = AimdConfig(ttft_p99_slo_s=config.ttft_p99_slo_s, tpot_p99_slo_s=config.tpot_p99_slo_s)
    return _oracle(profile_name, single, objectives, seed, max_limit)


@cache
def _oracle(profile_name: str, single: Conditions, config: AimdConfig, seed: int, max_limit: int) -> Oracle:
    measured: dict[int, StaticPoint] = {}

    def measure(limit: int) -> StaticPoint:
        if limit not in measured:
            measured[limit] = static_point(profile_name, single, config, limit, seed)
        return measured[limit]

    grid = _grid(single.clients[0], max_limit)
    for i, limit in enumerate(grid):
        measure(limit)
        best = max(measured.values(), key=lambda p: p.goodput)
        recent = [measured[level] for level in grid[max(0, i - 2) : i + 1]]
        if limit > best.limit and len(recent) == 3 and all(p.goodput < 0.8 * best.goodput for p in recent):
            break  # well past the cliff
    for _ in range(3):  # refine until the answer is bracketed by measured neighbours
        best = max(measured.values(), key=lambda p: p.goodput)
        levels = sorted(measured)
        sweet = next(level for level in levels if measured[level].goodput >= SWEET_FRACTION * best.goodput)
        below = max((level for level in levels if level < sweet), default=0)
        around = [best.limit - 1, best.limit + 1, *range(below + 1, sweet)]
        todo = [level for level in around if 1 <= level <= min(max_limit, single.clients[0]) and level not in measured]
        if not todo:
            break
        for level in todo:
            measure(level)
    points = tuple(measured[level] for level in sorted(measured))
    best = max(points, key=lambda p: p.goodput)
    sweet = next(p.limit for p in points if p.goodput >= SWEET_FRACTION * best.goodput)
    onset = next((p.limit for p in points if p.preemptions > 0), None)
    return Oracle(points, best, sweet, onset)
