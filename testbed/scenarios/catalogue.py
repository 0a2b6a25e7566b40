"""The controller's scenarios, as data, and the one function that runs and judges any of them.

Vector's adaptive-concurrency tests taught the shape: a scenario is a description of the world (the
backend, the clients, what changes when) plus *ranges on outcomes*, never on the mechanism. Each phase
here names the checks that apply to it; every check compares the controller with an oracle computed
for that phase's conditions by simulating every static limit (:mod:`testbed.scenarios.evaluate`).

Checks (the issue's acceptance criteria):

- ``converge``: within ``CONVERGE_S`` of the phase start the limit enters the band of +-20% around the
  oracle's sweet spot, and from then on stays in it for at least ``IN_BAND_SHARE`` of the phase's
  ticks (probes step out of it briefly by design) with its median inside it. With several gateways, the
  limit is their sum (those with clients).
- ``holds_goodput``: as ``goodput``, at ``HOLD_RATIO`` (0.8): what the controller must keep on the request
  path's signals alone while the backend's ``/metrics`` lie or go silent.
- ``goodput``: goodput within the objectives, from ``CONVERGE_S`` after the phase start to its end, is at
  least ``GOODPUT_RATIO`` x the best static limit's.
- ``tpot``: p99 TPOT over the same interval meets its objective.
- ``no_drift``: the limit never rises during the phase (idle or light load: nothing to learn).
- ``below_onset``: after convergence the limit stays below the smallest static limit that preempted.
- ``backs_off``: the limit ends the phase at most half of where it started (an error storm).
- ``fair``: every gateway's median limit is within 25% of its demand-weighted fair share (the gateways'
  summed medians, split in proportion to their clients; with even demand, their mean).
- ``sum_in_band``: the median of the gateways' summed limit, from ``CONVERGE_S`` after the phase start, lies in
  the band: replicas together sit where one gateway would (see "Replicas" in ``docs/controller.md``).
- ``absorb``: within ``ABSORB_S`` of the phase start (a replica joined or left), every gateway's limit is
  within 25% of its demand-weighted share of the summed limit, and stays so in ``IN_BAND_SHARE`` of the
  remaining ticks.
- ``quiet_queue``: the backend's waiting gauge, scraped as a scraper reads it, was non-zero in at least
  ``NOISY_QUEUE_SHARE`` of the scrapes (else the phase tests nothing), and no decrease said
  ``backend_queue``: requests in transit to the next engine step are not a queue.
- ``no_creep``: from ``CONVERGE_S`` after the phase start, the limit never falls under the band.
- ``no_gateway_queue``: from ``CONVERGE_S`` after the phase start, nothing waits in the gateway's queue
  (the demand is under the sweet spot: a limit under the demand is a limit that crept down).

A scenario may start from a sweep (``sweep``): the levels ``SWEEP_LEVELS`` measured as static limits
under the given conditions (what ``sweetspot sweep`` measures), the smallest reaching
``SWEEP_FRACTION`` of their peak as the sweet spot, handed to the controller as its
:class:`StartPoint`, as ``--sweep-result`` does.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gateway.control.algorithm import LimitAlgorithm, Reason
from gateway.control.config import AimdConfig, StartPoint
from gateway.control.observation import Headroom
from gateway.sim.profiles import get_profile
from testbed.scenarios.evaluate import Oracle, goodput, oracle, static_point, tpot_p99, ttft_p99
from testbed.scenarios.harness import Conditions, Harness, Tenancy, Workload

CONVERGE_S = 30.0
BAND = 0.2
IN_BAND_SHARE = 0.8
GOODPUT_RATIO = 0.95
HOLD_RATIO = 0.8
FAIR_SHARE = 0.25
ABSORB_S = 60.0
NOISY_QUEUE_SHARE = 0.25
SWEEP_LEVELS = (16, 24, 32, 48)  # the demo's
SWEEP_FRACTION = 0.9  # `sweetspot sweep`'s default

QWEN = "qwen3.6-35b-a3b-32gb"
LLAMA_TIGHT_KV = "llama3.1-8b-24gb"
CHAT = Workload(prompt=(256, 768), output=(256, 768))
SHORT = Workload(prompt=(256, 768), output=(64, 256))
LONG = Workload(prompt=(256, 768), output=(768, 1536))
DEMO = Workload(prompt=(256, 256), output=(64, 192))  # `sweetspot demo`'s
TINY = Workload(prompt=(256, 256), output=(16, 48))  # many requests a second: arrivals in every step
WHOLE = replace(CHAT, streamed=0.0)  # nobody streams: tokens show only when a request ends
MIXED = replace(CHAT, streamed=0.5)
OVERLOAD = (80,)
FULL = ("converge", "goodput", "tpot")
REPLICAS = ("fair", "converge", "sum_in_band", "goodput", "tpot")
LIES = ("holds_goodput", "tpot")  # /metrics lie or go silent: the request path's signals alone
# The checks that compare a phase with the best static limits under its conditions (the oracle).
ORACLE_CHECKS = frozenset({"converge", "goodput", "holds_goodput", "below_onset", "no_creep", "sum_in_band"})


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    duration_s: float
    conditions: Conditions
    checks: tuple[str, ...] = FULL
    restart: tuple[int, ...] = ()  # gateways that start afresh at the phase start (a new or restarted pod)
    leave: tuple[int, ...] = ()  # gateways that go away at the phase start (their shared entry with them)

    @property
    def judged_against_static(self) -> bool:
        """Whether a check of this phase compares with the best static limits (idle phases, storms: no)."""
        return bool(set(self.checks) & ORACLE_CHECKS)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    profile: str
    phases: tuple[Phase, ...]
    seed: int = 1
    initial_limit: int = 8
    sweep: Conditions | None = None  # start from a sweep measured under these conditions
    sweep_levels: tuple[int, ...] = SWEEP_LEVELS
    shared: bool = False  # the gateways share their demand and limits (Redis between real replicas)


def sweep_start(
    profile: str, conditions: Conditions, config: AimdConfig, seed: int, levels_swept: tuple[int, ...] = SWEEP_LEVELS
) -> StartPoint:
    """What ``sweetspot sweep`` would hand the controller for a backend under ``conditions``."""
    levels = [(level, static_point(profile, conditions, config, level, seed).tokens_per_s) for level in levels_swept]
    peak = max(rate for _, rate in levels)
    spot = next(level for level, rate in levels if rate >= SWEEP_FRACTION * peak)
    top = next(level for level, rate in levels if rate >= peak)
    return StartPoint(spot, peak, tuple((level, rate) for level, rate in levels if level <= top))


# What a frozen /metrics endpoint keeps saying: the KV cache full and a queue, from a scrape long ago.
_STALE_ALARM = Headroom(kv_usage=0.99, backend_running=64, backend_waiting=20, preemptions_total=500.0, backend_at=60.0)

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "steady_overload",
        "80 chat clients against one backend, from the default initial limit",
        QWEN,
        (Phase("overload", 240, Conditions(OVERLOAD, CHAT)),),
    ),
    Scenario(
        "load_steps",
        "client load steps down below the knee and back up",
        QWEN,
        (
            Phase("high", 150, Conditions(OVERLOAD, CHAT)),
            Phase("low", 90, Conditions((12,), CHAT), ("no_drift", "goodput")),
            Phase("high again", 150, Conditions(OVERLOAD, CHAT)),
        ),
    ),
    Scenario(
        "backend_slowdown",
        "the backend runs 2x slower for a while, then recovers",
        QWEN,
        (
            Phase("normal", 150, Conditions(OVERLOAD, CHAT)),
            Phase("2x slower", 150, Conditions(OVERLOAD, CHAT, speed_factor=2.0)),
            Phase("recovered", 150, Conditions(OVERLOAD, CHAT)),
        ),
    ),
    Scenario(
        "output_mix_shift",
        "answers get 5x longer: more KV per request, the limit must not collapse",
        QWEN,
        (
            Phase("short answers", 150, Conditions(OVERLOAD, SHORT)),
            Phase("long answers", 180, Conditions(OVERLOAD, LONG)),
        ),
    ),
    Scenario(
        "tight_kv",
        "KV cache full before the compute knee: settle below preemption onset",
        LLAMA_TIGHT_KV,
        (Phase("overload", 240, Conditions(OVERLOAD, CHAT), (*FULL, "below_onset")),),
    ),
    Scenario(
        "error_storm",
        "half the requests fail for 20 s, then the backend recovers",
        QWEN,
        (
            Phase("normal", 120, Conditions(OVERLOAD, CHAT)),
            Phase("storm", 20, Conditions(OVERLOAD, CHAT, error_rate=0.5), ("backs_off",)),
            Phase("recovered", 150, Conditions(OVERLOAD, CHAT)),
        ),
    ),
    Scenario(
        "stale_metrics",
        "the backend's /metrics freeze, last reporting a full cache: local signals only",
        QWEN,
        (
            Phase("live metrics", 120, Conditions(OVERLOAD, CHAT)),
            Phase("frozen metrics", 180, Conditions(OVERLOAD, CHAT, metrics="frozen", frozen_headroom=_STALE_ALARM)),
        ),
    ),
    # The backend's /metrics go silent or lie about the KV cache (issue 38, item 5): after a live phase, the
    # request path's signals (throughput, TTFT, TPOT, errors) are all the controller can trust.
    Scenario(
        "metrics_missing",
        "the backend's /metrics answer nothing (no KV, queue, token counter or cache size): local signals only",
        QWEN,
        (
            Phase("live metrics", 120, Conditions(OVERLOAD, CHAT)),
            Phase("no metrics", 180, Conditions(OVERLOAD, CHAT, metrics="missing"), LIES),
        ),
    ),
    Scenario(
        "kv_reads_zero",
        "the backend's KV usage reads 0 whatever the cache holds (queue and counters true)",
        QWEN,
        (
            Phase("live metrics", 120, Conditions(OVERLOAD, CHAT)),
            Phase("KV reads 0", 180, Conditions(OVERLOAD, CHAT, metrics="kv_zero"), LIES),
        ),
    ),
    Scenario(
        "kv_reads_one",
        "the backend's KV usage reads 1 (full) whatever the cache holds (queue and counters true)",
        QWEN,
        (
            Phase("live metrics", 120, Conditions(OVERLOAD, CHAT)),
            Phase("KV reads 1", 180, Conditions(OVERLOAD, CHAT, metrics="kv_one"), LIES),
        ),
    ),
    # The same lies where they matter: a backend whose KV cache fills before its compute knee. The live phase
    # is a warm-up (its goodput over the whole 240 s is ``tight_kv``'s check; 90 s of it, with tenants, reads
    # 0.947). With /metrics silent, the preemption counter is gone with the cache size: the cliff is found
    # by throughput and TPOT alone and touched now and then, so ``below_onset`` is not asserted there.
    Scenario(
        "tight_kv_metrics_missing",
        "KV cache full before the compute knee, then /metrics answer nothing: no KV, preemption counter or cache size",
        LLAMA_TIGHT_KV,
        (
            Phase("live metrics", 120, Conditions(OVERLOAD, CHAT), ("converge", "tpot", "below_onset")),
            Phase("no metrics", 180, Conditions(OVERLOAD, CHAT, metrics="missing"), LIES),
        ),
    ),
    Scenario(
        "tight_kv_reads_zero",
        "KV cache full before the compute knee, then its KV usage reads 0",
        LLAMA_TIGHT_KV,
        (
            Phase("live metrics", 120, Conditions(OVERLOAD, CHAT), ("converge", "tpot", "below_onset")),
            Phase("KV reads 0", 180, Conditions(OVERLOAD, CHAT, metrics="kv_zero"), (*LIES, "below_onset")),
        ),
    ),
    Scenario(
        "tight_kv_reads_one",
        "KV cache full before the compute knee, then its KV usage reads 1",
        LLAMA_TIGHT_KV,
        (
            Phase("live metrics", 120, Conditions(OVERLOAD, CHAT), ("converge", "tpot", "below_onset")),
            Phase("KV reads 1", 180, Conditions(OVERLOAD, CHAT, metrics="kv_one"), (*LIES, "below_onset")),
        ),
    ),
    Scenario(
        "idle_period",
        "no clients at all for two minutes: the limit must not drift",
        QWEN,
        (
            Phase("busy", 120, Conditions(OVERLOAD, CHAT)),
            Phase("idle", 120, Conditions((0,), CHAT), ("no_drift",)),
            Phase("busy again", 90, Conditions(OVERLOAD, CHAT)),
        ),
    ),
    Scenario(
        "backend_queue_noise",
        "short answers through an HTTP hop: the backend's waiting gauge is often "
        "non-zero between engine steps, which is not a queue",
        QWEN,
        (Phase("overload", 240, Conditions(OVERLOAD, TINY, hop_s=0.01), (*FULL, "quiet_queue")),),
    ),
    Scenario(
        "start_from_sweep",
        "starts at a sweep's sweet spot (with its levels), light load, then a surge",
        QWEN,
        (Phase("light", 16, Conditions((4,), DEMO), ("no_drift",)), Phase("surge", 150, Conditions((64,), DEMO))),
        sweep=Conditions((64,), DEMO),
    ),
    Scenario(
        "start_from_short_sweep",
        "starts from a sweep that stopped before the curve flattened (4, 8, 16): "
        "the sweet spot it reports is too low, and the controller climbs from it",
        QWEN,
        (Phase("surge", 150, Conditions((64,), DEMO), ("goodput", "tpot")),),
        sweep=Conditions((64,), DEMO),
        sweep_levels=(4, 8, 16),
    ),
    Scenario(
        "slowdown_then_calm",
        "the backend slows 2x and recovers, then demand drops under the sweet spot: "
        "no creep down from readings of the slow period, nothing queued at 16 clients",
        QWEN,
        (
            Phase("normal", 120, Conditions(OVERLOAD, DEMO, hop_s=0.01)),
            Phase("2x slower", 60, Conditions(OVERLOAD, DEMO, speed_factor=2.0, hop_s=0.01), ("tpot",)),
            Phase("recovered", 90, Conditions(OVERLOAD, DEMO, hop_s=0.01), ("goodput", "tpot", "no_creep")),
            Phase("calm", 60, Conditions((16,), DEMO, hop_s=0.01), ("no_drift", "no_gateway_queue")),
        ),
        sweep=Conditions(OVERLOAD, DEMO),
    ),
    Scenario(
        "two_gateways",
        "two gateways, 40 clients each, share one backend (nothing shared between them)",
        QWEN,
        (Phase("shared", 240, Conditions((40, 40), CHAT), ("fair", "goodput", "tpot")),),
    ),
    # Non-streamed and mixed traffic: the gateway sees a whole answer's tokens only when it ends, and the
    # backend's live counter as a scrape reads it.
    Scenario(
        "whole_steady_overload",
        "80 clients, none streaming, against one backend",
        QWEN,
        (Phase("overload", 240, Conditions(OVERLOAD, WHOLE)),),
    ),
    Scenario(
        "whole_load_steps",
        "non-streamed load steps down below the knee and back up",
        QWEN,
        (
            Phase("high", 150, Conditions(OVERLOAD, WHOLE)),
            Phase("low", 90, Conditions((12,), WHOLE), ("no_drift", "goodput")),
            Phase("high again", 150, Conditions(OVERLOAD, WHOLE)),
        ),
    ),
    Scenario(
        "whole_backend_slowdown",
        "non-streamed; the backend runs 2x slower for a while, then recovers",
        QWEN,
        (
            Phase("normal", 150, Conditions(OVERLOAD, WHOLE)),
            Phase("2x slower", 150, Conditions(OVERLOAD, WHOLE, speed_factor=2.0)),
            Phase("recovered", 150, Conditions(OVERLOAD, WHOLE)),
        ),
    ),
    Scenario(
        "whole_tight_kv",
        "non-streamed; KV cache full before the compute knee",
        LLAMA_TIGHT_KV,
        (Phase("overload", 240, Conditions(OVERLOAD, WHOLE), (*FULL, "below_onset")),),
    ),
    Scenario(
        "mixed_steady_overload",
        "80 clients, half of the requests streamed",
        QWEN,
        (Phase("overload", 240, Conditions(OVERLOAD, MIXED)),),
    ),
    Scenario(
        "mixed_two_gateways",
        "two gateways, 40 clients each, half of the requests streamed: each takes its share of the backend's counter",
        QWEN,
        (Phase("shared", 240, Conditions((40, 40), MIXED), ("fair", "goodput", "tpot")),),
    ),
    # Without a live counter (llama-server counts when requests end) only the gateway's own count is left:
    # each whole answer spread over its life, a reading final once its requests ended. A step then takes
    # a request's life longer to judge, so convergence is not asserted (see docs/controller.md).
    Scenario(
        "whole_without_counter",
        "80 clients, none streaming, a backend without a live token counter "
        "(llama-server): the gateway's own count, each answer spread over its life",
        QWEN,
        (Phase("overload", 240, Conditions(OVERLOAD, WHOLE, backend_counter=False), ("goodput", "tpot")),),
    ),
    Scenario(
        "mixed_without_counter",
        "80 clients, half of the requests streamed, a backend without a live "
        "token counter: streamed tokens as they come, whole answers spread over their lives",
        QWEN,
        (Phase("overload", 240, Conditions(OVERLOAD, MIXED, backend_counter=False), ("goodput", "tpot")),),
    ),
    Scenario(
        "replicas_2",
        "two replicas sharing their demand and limits, 40 clients each",
        QWEN,
        (Phase("shared", 240, Conditions((40, 40), CHAT), REPLICAS),),
        shared=True,
    ),
    Scenario(
        "replicas_4",
        "four replicas sharing their demand and limits, 20 clients each",
        QWEN,
        (Phase("shared", 240, Conditions((20,) * 4, CHAT), REPLICAS),),
        shared=True,
    ),
    Scenario(
        "replicas_8",
        "eight replicas sharing their demand and limits, 10 clients each",
        QWEN,
        (Phase("shared", 240, Conditions((10,) * 8, CHAT), REPLICAS),),
        shared=True,
    ),
    Scenario(
        "replicas_uneven",
        "two replicas with uneven demand, 60 and 20 clients: shares 3:1",
        QWEN,
        (Phase("shared", 240, Conditions((60, 20), CHAT), REPLICAS),),
        shared=True,
    ),
    Scenario(
        "replica_joins_leaves",
        "two replicas, a third joins (its clients spread over three), then leaves",
        QWEN,
        (
            Phase("two", 120, Conditions((40, 40, 0), CHAT), REPLICAS),
            Phase("third joins", 150, Conditions((27, 27, 26), CHAT), (*REPLICAS, "absorb"), restart=(2,)),
            Phase("third leaves", 150, Conditions((40, 40, 0), CHAT), (*REPLICAS, "absorb"), leave=(2,)),
        ),
        shared=True,
    ),
)


@dataclass
class PhaseResult:
    scenario: str
    phase: str
    start: float
    end: float
    checks: tuple[str, ...]
    oracle: Oracle | None  # None for phases no check compares with the static limits (idle, a storm)
    band: tuple[float, float]
    limits: list[list[tuple[float, int]]]  # per gateway, (time, limit) at each tick of the phase
    settled: float | None  # median limit (summed over gateways) after convergence
    convergence_s: float | None
    goodput: float
    goodput_ratio: float | None
    tpot_p99: float | None
    preemptions: int
    failures: list[str] = field(default_factory=list)
    ttft_p99: float | None = None  # net of the gateway's queue, over the same interval as goodput
    absorbed_s: float | None = None  # for ``absorb``: how long the shares took to settle
    clients: tuple[int, ...] = ()  # per gateway, in this phase

    @property
    def ok(self) -> bool:
        return not self.failures


def _convergence(limits: list[tuple[float, int]], start: float, band: tuple[float, float]) -> float | None:
    """Seconds from ``start`` to the first tick after which the limit is in ``band`` for at least
    ``IN_BAND_SHARE`` of the remaining ticks, entering it at that tick."""
    inside = [band[0] <= limit <= band[1] for _, limit in limits]
    for i, (t, _) in enumerate(limits):
        rest = inside[i:]
        if inside[i] and sum(rest) >= IN_BAND_SHARE * len(rest):
            return t - start
    return None


def _shares(limits: list[float], demands: tuple[int, ...]) -> list[tuple[int, float, float]]:
    """(gateway, limit, demand-weighted share of the summed limit) for every gateway with clients."""
    active = [g for g, clients in enumerate(demands) if clients > 0]
    total_limit = sum(limits[g] for g in active)
    total_demand = sum(demands[g] for g in active)
    return [(g, limits[g], total_limit * demands[g] / total_demand) for g in active]


def _absorbed(per_gateway: list[list[tuple[float, int]]], demands: tuple[int, ...], start: float) -> float | None:
    """Seconds from ``start`` to the first tick from which every gateway is within ``FAIR_SHARE`` of its
    share in at least ``IN_BAND_SHARE`` of the remaining ticks (and at that tick).

    The gateways tick at staggered offsets, so one may have a tick fewer in the phase: the ticks pair up round
    by round and an incomplete last round is left out (``strict=False``)."""
    fair = [
        all(
            abs(limit - share) <= FAIR_SHARE * share
            for _, limit, share in _shares([float(limit) for _, limit in ticks], demands)
        )
        for ticks in zip(*per_gateway, strict=False)
    ]
    times = [ticks[0][0] for ticks in zip(*per_gateway, strict=False)]
    for i, t in enumerate(times):
        rest = fair[i:]
        if fair[i] and sum(rest) >= IN_BAND_SHARE * len(rest):
            return t - start
    return None


def run(
    scenario: Scenario,
    config: AimdConfig | None = None,
    *,
    algorithm: Callable[[], LimitAlgorithm] | None = None,
    static_limit: int | None = None,
    control_interval_s: float = 2.0,
    scrape_interval_s: float = 2.0,
    count_at_end: bool = False,
    tenancy: Tenancy | None = None,
    hard_cap: int | None = None,
) -> list[PhaseResult]:
    """Simulate ``scenario`` with the controller and judge every phase against its oracle.

    ``algorithm`` (a factory, one per gateway) or ``static_limit`` run something else in the
    controller's place, judged the same way: the comparison baselines (``bench/baselines.py``). They
    may tick and scrape at their own reference's pace. ``count_at_end``: see :class:`Harness`. ``tenancy``
    splits the clients between tenants queued fairly (the oracle's static runs stay one FIFO: the best
    static limit does not depend on it). ``hard_cap``: a fixed one in place of the gateway's own (the KV
    cache's, from vLLM's published cache size and the recent requests)."""
    config = config or AimdConfig()
    profile = get_profile(scenario.profile)
    gateways = len(scenario.phases[0].conditions.clients)
    start_point = None
    if scenario.sweep is not None and algorithm is None and static_limit is None:
        start_point = sweep_start(scenario.profile, scenario.sweep, config, scenario.seed, scenario.sweep_levels)
    harness = Harness(
        profile,
        config,
        gateways=gateways,
        seed=scenario.seed,
        initial_limit=scenario.initial_limit,
        start=start_point,
        algorithm=algorithm,
        static_limit=static_limit,
        control_interval_s=control_interval_s,
        scrape_interval_s=scrape_interval_s,
        count_at_end=count_at_end,
        shared=scenario.shared,
        tenancy=tenancy,
        hard_cap=hard_cap,
    )
    results = []
    for phase in scenario.phases:
        start = harness.now
        for g in phase.restart:
            harness.restart(g)
        for g in phase.leave:
            harness.leave(g)
        before = [gw.limit for gw in harness.gateways]
        harness.run_phase(phase.conditions, phase.duration_s)
        end = harness.now
        results.append(_judge(scenario, phase, harness, config, start, end, before))
    return results


def phase_oracle(scenario: Scenario, phase: Phase, config: AimdConfig) -> Oracle:
    """The best static limits under ``phase``'s conditions, up to the backend's own cap (at least 128, so a
    knee in the hundreds is found too): what the phase is judged against."""
    ceiling = max(128, get_profile(scenario.profile).max_num_seqs)
    return oracle(scenario.profile, phase.conditions, config, scenario.seed, ceiling)


def _judge(
    scenario: Scenario, phase: Phase, harness: Harness, config: AimdConfig, start: float, end: float, before: list[int]
) -> PhaseResult:
    the_oracle = phase_oracle(scenario, phase, config) if phase.judged_against_static else None
    sweet = the_oracle.sweet_spot if the_oracle is not None else 0
    band = ((1 - BAND) * sweet, (1 + BAND) * sweet)
    per_gateway = [
        [(t, limit) for t, limit in harness.trace.limits(g) if start < t <= end] for g in range(len(harness.gateways))
    ]
    # The summed limit of the gateways that have clients: an idle one's limit holds nothing back. The gateways
    # tick at staggered offsets, so one may have a tick fewer in the phase: an incomplete last round is left out.
    demands = phase.conditions.clients
    active = [ticks for g, ticks in enumerate(per_gateway) if demands[g] > 0] or per_gateway
    total = [(ticks[0][0], sum(limit for _, limit in ticks)) for ticks in zip(*active, strict=False)]
    converged = _convergence(total, start, band) if the_oracle is not None else None
    settled_from = start + (converged if converged is not None else CONVERGE_S)
    settled_values = [limit for t, limit in total if t >= settled_from]
    settled = statistics.median(settled_values) if settled_values else None
    judged_from = min(start + CONVERGE_S, end)
    finished = harness.trace.finished + harness.open_requests()
    good, _ = goodput(finished, judged_from, end, config)
    best = the_oracle.best.goodput if the_oracle is not None else 0.0
    ratio = good / best if best > 0 else None
    tpot = tpot_p99(finished, judged_from, end)
    result = PhaseResult(
        scenario.name,
        phase.name,
        start,
        end,
        phase.checks,
        the_oracle,
        band,
        per_gateway,
        settled,
        converged,
        good,
        ratio,
        tpot,
        harness.trace.preemptions_between(judged_from, end),
        ttft_p99=ttft_p99(finished, judged_from, end),
        clients=demands,
    )
    failures = result.failures
    for check in phase.checks:
        if check == "converge":
            if converged is None or converged > CONVERGE_S:
                failures.append(
                    f"did not converge into {band[0]:.1f}-{band[1]:.1f} within {CONVERGE_S:.0f}s "
                    f"(convergence: {converged})"
                )
            elif settled is None or not band[0] <= settled <= band[1]:
                failures.append(f"settled at {settled}, outside {band[0]:.1f}-{band[1]:.1f}")
        elif check == "goodput" and ratio is not None and ratio < GOODPUT_RATIO:
            failures.append(f"goodput {good:.0f} tok/s is {ratio:.3f} x the best static ({best:.0f})")
        elif check == "holds_goodput" and ratio is not None and ratio < HOLD_RATIO:
            failures.append(
                f"goodput {good:.0f} tok/s is {ratio:.3f} x the best static ({best:.0f}), under {HOLD_RATIO}"
            )
        elif (
            check == "tpot" and tpot is not None and config.tpot_p99_slo_s is not None and tpot > config.tpot_p99_slo_s
        ):
            failures.append(f"p99 TPOT {tpot * 1000:.1f} ms over the {config.tpot_p99_slo_s * 1000:.0f} ms objective")
        elif check == "no_drift":
            # From the first tick with nothing queued: the previous phase's backlog may still drain.
            for g in range(len(harness.gateways)):
                ticks = [tick for tick in harness.trace.ticks if tick.gateway == g and start < tick.now <= end]
                idle_from = next((i for i, tick in enumerate(ticks) if tick.queue == 0), len(ticks))
                if idle_from < len(ticks):
                    held = ticks[idle_from].limit
                    highest = max(tick.limit for tick in ticks[idle_from:])
                    if highest > held:
                        failures.append(f"gateway {g} drifted up from {held} to {highest} without demand")
        elif check == "below_onset" and the_oracle is not None and the_oracle.preemption_onset is not None:
            if settled is None or settled >= the_oracle.preemption_onset:
                failures.append(f"settled at {settled}, not below preemption onset {the_oracle.preemption_onset}")
            minutes = (end - judged_from) / 60
            if result.preemptions > minutes:
                failures.append(f"{result.preemptions} preemptions after convergence (more than one a minute)")
        elif check == "backs_off":
            last = per_gateway[0][-1][1] if per_gateway[0] else before[0]
            if last > before[0] / 2:
                failures.append(f"limit {last} after the storm, more than half of {before[0]}")
        elif check == "quiet_queue":
            scraped = [waiting for t, waiting in harness.trace.waiting if start < t <= end]
            noisy = sum(1 for waiting in scraped if waiting > 0) / max(len(scraped), 1)
            if noisy < NOISY_QUEUE_SHARE:
                failures.append(f"the backend's queue was non-empty in only {noisy:.0%} of scrapes: nothing tested")
            cuts = [
                t
                for t in harness.trace.ticks
                if start < t.now <= end and t.action == "decrease" and t.reason == Reason.BACKEND_QUEUE.value
            ]
            if cuts:
                failures.append(
                    f"{len(cuts)} backend_queue decrease(s) (first at {cuts[0].now - start:.0f} s) with "
                    f"the backend's queue non-empty in {noisy:.0%} of scrapes, max {max(scraped)}"
                )
        elif check == "no_creep" and the_oracle is not None:
            low = [t for t in harness.trace.ticks if judged_from <= t.now <= end and t.limit < band[0]]
            if low:
                failures.append(
                    f"crept under the band: limit {min(t.limit for t in low)} at {len(low)} tick(s), "
                    f"first {low[0].now - start:.0f} s into the phase (band {band[0]:.1f}-{band[1]:.1f})"
                )
        elif check == "no_gateway_queue":
            queued = [t for t in harness.trace.ticks if judged_from <= t.now <= end and t.queue > 0]
            if queued:
                failures.append(
                    f"requests queued in the gateway at {len(queued)} tick(s) (first at "
                    f"{queued[0].now - start:.0f} s, limit {queued[0].limit}) under a demand below the sweet spot"
                )
        elif check == "fair":
            medians = [
                statistics.median(limit for t, limit in ticks if t >= start + CONVERGE_S) for ticks in per_gateway
            ]
            for g, median, share in _shares(medians, demands):
                if abs(median - share) > FAIR_SHARE * share:
                    failures.append(f"gateway {g} holds {median}, not within 25% of its fair share {share:.1f}")
        elif check == "sum_in_band" and the_oracle is not None:
            summed = [limit for t, limit in total if t >= start + CONVERGE_S]
            median = statistics.median(summed) if summed else None
            if median is None or not band[0] <= median <= band[1]:
                failures.append(f"summed limit's median {median} outside the band {band[0]:.1f}-{band[1]:.1f}")
        elif check == "absorb":
            absorbed = _absorbed(per_gateway, demands, start)
            result.absorbed_s = absorbed
            if absorbed is None or absorbed > ABSORB_S:
                failures.append(f"shares not absorbed within {ABSORB_S:.0f} s (absorbed after {absorbed})")
    return result


def by_name(name: str) -> Scenario:
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    raise KeyError(f"unknown scenario {name!r}; known: {', '.join(s.name for s in SCENARIOS)}")
