"""Each comparison baseline reacts as its reference says (gateway/control/baselines, bench/baselines.py).

The benchmark's verdict is only as good as its baselines: a Vegas that never grows or an Envoy that never
re-measures its minRTT would lose by construction. So each rule of each reference is driven here with
hand-built samples and observations, and the expected numbers are worked out from the reference's own
formulas (AIMDLimit.java, VegasLimit.java, Gradient2Limit.java, gradient_controller.cc, GIE's saturation
detector), not from this code.
"""

from __future__ import annotations

import pytest

from gateway.control.algorithm import Action, LimitAlgorithm, RequestObserver
from gateway.control.baselines import (
    AimdLatencyLimit,
    EnvoyGradient,
    Gradient2Limit,
    StaticLimit,
    ThresholdGate,
    VegasLimit,
)
from gateway.control.baselines.vegas import log10_root
from gateway.control.config import AimdConfig
from gateway.control.observation import Headroom, LimiterState, Observation, observe
from gateway.control.window import Outcome, RequestSample, SlidingWindow
from gateway.sim.profiles import get_profile
from testbed.scenarios.harness import Conditions, Harness, Workload


def sample(rtt: float, *, at: float = 0.0, outcome: Outcome = Outcome.OK) -> RequestSample:
    """A request admitted at ``at`` that took ``rtt`` seconds at the upstream."""
    return RequestSample(
        arrived=at,
        admitted=at,
        finished=at + rtt,
        first_token=at + min(rtt, 0.1),
        prompt_tokens=512,
        output_tokens=256,
        outcome=outcome,
    )


def tick(
    now: float, *, inflight: int = 0, queue: int = 0, limit: int = 1, headroom: Headroom = Headroom()
) -> Observation:
    return observe(now, SlidingWindow(10.0).stats(now), LimiterState(limit, inflight, inflight, queue), headroom)


def feed(
    algorithm: RequestObserver,
    rtt: float,
    times: int = 1,
    *,
    inflight: int = 100,
    at: float = 0.0,
    outcome: Outcome = Outcome.OK,
) -> int:
    limit = 0
    for _ in range(times):
        limit = algorithm.on_request(at + rtt, sample(rtt, at=at, outcome=outcome), inflight, inflight)
    return limit


def test_every_baseline_is_a_limit_algorithm() -> None:
    algorithms: list[LimitAlgorithm] = [
        StaticLimit(8),
        ThresholdGate(),
        EnvoyGradient(),
        Gradient2Limit(),
        VegasLimit(),
        AimdLatencyLimit(),
    ]
    for algorithm in algorithms:
        decision = algorithm.step(tick(1.0))
        assert decision.limit == algorithm.limit
        assert isinstance(algorithm.state(), dict)
    assert not isinstance(StaticLimit(8), RequestObserver)
    assert all(isinstance(a, RequestObserver) for a in algorithms[1:])


# --- static ------------------------------------------------------------------------------------------
def test_static_never_moves() -> None:
    static = StaticLimit(32)
    for now in (2.0, 4.0):
        decision = static.step(tick(now, inflight=32, queue=50, headroom=Headroom(kv_usage=1.0, backend_at=now)))
        assert (decision.limit, decision.action) == (32, Action.HOLD)
    with pytest.raises(ValueError):
        StaticLimit(0)


# --- GIE threshold gate --------------------------------------------------------------------------------
def metrics(now: float, *, kv: float, waiting: int, age: float = 0.0) -> Headroom:
    return Headroom(kv_usage=kv, backend_waiting=waiting, backend_running=10, backend_at=now - age)


def test_threshold_gate_opens_under_both_thresholds_and_lets_every_waiting_request_through() -> None:
    gate = ThresholdGate()
    decision = gate.step(tick(1.0, inflight=10, queue=30, headroom=metrics(1.0, kv=0.79, waiting=4)))
    assert gate.open and decision.limit == 40  # nothing of its own holds anyone back


@pytest.mark.parametrize(("kv", "waiting"), [(0.8, 0), (0.5, 5), (0.95, 9)])
def test_threshold_gate_shuts_at_either_threshold(kv: float, waiting: int) -> None:
    gate = ThresholdGate()
    decision = gate.step(tick(1.0, inflight=12, queue=30, headroom=metrics(1.0, kv=kv, waiting=waiting)))
    assert not gate.open and decision.limit == 12  # nobody new


def test_threshold_gate_treats_stale_or_missing_metrics_as_saturated() -> None:
    gate = ThresholdGate()
    gate.step(tick(1.0, inflight=12, queue=3, headroom=metrics(1.0, kv=0.1, waiting=0, age=0.25)))
    assert not gate.open
    gate.step(tick(1.05, inflight=12, queue=3, headroom=metrics(1.05, kv=0.1, waiting=0, age=0.15)))
    assert gate.open
    gate.step(tick(1.1, inflight=12, queue=3))
    assert not gate.open


def test_a_shut_gate_keeps_slots_of_ending_requests_and_an_open_one_passes_them_on() -> None:
    gate = ThresholdGate()
    gate.step(tick(1.0, inflight=12, queue=3, headroom=metrics(1.0, kv=0.9, waiting=0)))
    assert gate.on_request(1.01, sample(1.0), 12, 11) == 11
    assert gate.on_request(1.02, sample(1.0), 12, 10) == 10
    gate.step(tick(1.05, inflight=10, queue=5, headroom=metrics(1.05, kv=0.5, waiting=0)))
    assert gate.limit == 15
    assert gate.on_request(1.06, sample(1.0), 12, 14) == 15


# --- Netflix AIMDLimit ---------------------------------------------------------------------------------
def test_aimd_cuts_by_backoff_ratio_on_a_latency_over_the_timeout() -> None:
    aimd = AimdLatencyLimit(initial_limit=100)
    assert feed(aimd, 5.5) == 90
    assert feed(aimd, 5.5) == 81
    assert feed(aimd, 5.0) == 82  # at the timeout is not over it


def test_aimd_cuts_on_a_drop_and_ignores_cancellations() -> None:
    aimd = AimdLatencyLimit(initial_limit=100)
    assert feed(aimd, 0.5, outcome=Outcome.UPSTREAM_ERROR) == 90
    assert feed(aimd, 0.5, outcome=Outcome.TIMED_OUT) == 81
    assert feed(aimd, 9.0, outcome=Outcome.CLIENT_CANCELLED) == 81
    assert aimd.samples == 2


def test_aimd_grows_by_one_only_while_inflight_reaches_half_the_limit() -> None:
    aimd = AimdLatencyLimit(initial_limit=40)
    assert feed(aimd, 1.0, inflight=20) == 41
    assert feed(aimd, 1.0, inflight=20) == 41  # 20 x 2 < 41: app-limited, hold


def test_aimd_stays_within_its_published_bounds() -> None:
    aimd = AimdLatencyLimit()
    assert aimd.limit == 20
    assert feed(aimd, 30.0, 10) == 20  # minLimit 20: an LLM answer over 5 s can push it no lower
    assert feed(aimd, 1.0, 500) == 200


def test_aimd_rejects_what_its_builder_rejects() -> None:
    with pytest.raises(ValueError):
        AimdLatencyLimit(backoff_ratio=0.4)
    with pytest.raises(ValueError):
        AimdLatencyLimit(timeout_s=0)


# --- Netflix VegasLimit --------------------------------------------------------------------------------
def test_vegas_log10_root_matches_the_reference_lookup() -> None:
    assert [log10_root(n) for n in (0, 1, 9, 10, 99, 100, 999, 1000, 20000)] == [1, 1, 1, 1, 1, 2, 2, 3, 4]


def vegas_with_noload(rtt: float = 1.0, limit: int = 20) -> VegasLimit:
    vegas = VegasLimit(initial_limit=limit, probe_multiplier=10**6)
    assert feed(vegas, rtt) == limit  # the first sample only sets the no-load RTT
    assert vegas.rtt_noload == rtt
    return vegas


def test_vegas_adds_beta_when_no_queue_is_estimated() -> None:
    assert feed(vegas_with_noload(), 1.0) == 26  # queue 0 <= threshold 1: + beta (6)


def test_vegas_increases_by_log10_while_the_queue_estimate_is_under_alpha() -> None:
    vegas = vegas_with_noload()
    assert vegas.queue_estimate(1.1) == 2  # ceil(20 x (1 - 1/1.1)) = ceil(1.82)
    assert feed(vegas, 1.1) == 21


def test_vegas_holds_between_alpha_and_beta_and_decreases_over_beta() -> None:
    vegas = vegas_with_noload()
    assert vegas.queue_estimate(1.16) == 3
    assert feed(vegas, 1.16) == 20
    assert feed(vegas, 2.0) == 19  # queue ceil(20 x 0.5) = 10 > beta 6: - log10 (1)


def test_vegas_reads_a_longer_answer_as_a_queue() -> None:
    """The same backend, an answer 3x as long: Vegas cannot tell it from congestion."""
    vegas = vegas_with_noload(rtt=5.0)
    for _ in range(5):
        feed(vegas, 15.0)
    assert vegas.limit == 15


def test_vegas_decreases_on_a_drop_and_holds_when_app_limited() -> None:
    vegas = vegas_with_noload()
    assert feed(vegas, 1.0, outcome=Outcome.UPSTREAM_ERROR) == 19
    assert feed(vegas, 2.0, inflight=9) == 19  # 9 x 2 < 19: no move, even with a queue estimate


def test_vegas_takes_a_faster_sample_as_the_new_noload_rtt_and_reprobes_it() -> None:
    vegas = vegas_with_noload(rtt=2.0)
    feed(vegas, 1.0)
    assert vegas.rtt_noload == 1.0
    reprobing = VegasLimit(initial_limit=20, probe_multiplier=1, seed=3)
    feed(reprobing, 1.0)
    for _ in range(20):  # every probe_jitter (0.5-1) x 1 x limit samples the no-load RTT is re-read
        feed(reprobing, 4.0)
    assert reprobing.rtt_noload == 4.0


# --- Netflix Gradient2Limit ----------------------------------------------------------------------------
def test_gradient2_grows_by_the_queue_size_while_latency_holds() -> None:
    gradient2 = Gradient2Limit()
    limits = [feed(gradient2, 1.0) for _ in range(3)]
    # gradient 1: limit x 0.8 + (limit + 4) x 0.2 = limit + 0.8: 20.8, 21.6, 22.4, the integer part the limit
    assert limits == [20, 21, 22]
    assert gradient2.estimated_limit == pytest.approx(22.4)


def test_gradient2_cuts_when_latency_exceeds_its_tolerance_and_never_by_more_than_half() -> None:
    gradient2 = Gradient2Limit(initial_limit=100)
    for _ in range(10):
        feed(gradient2, 1.0)  # the long-term RTT: 1.0
    before = gradient2.estimated_limit
    feed(gradient2, 1.4)  # 1.5 x long / short > 1: within tolerance, still grows
    assert gradient2.estimated_limit > before
    before = gradient2.estimated_limit
    feed(gradient2, 10.0)  # gradient clamped to 0.5: x 0.9 + 0.8 after smoothing
    assert gradient2.gradient == 0.5
    assert gradient2.estimated_limit == pytest.approx(before * 0.9 + 0.8)


def test_gradient2_holds_when_app_limited_and_keeps_its_minimum() -> None:
    gradient2 = Gradient2Limit(initial_limit=60)
    assert feed(gradient2, 1.0, inflight=29) == 60
    floor = Gradient2Limit()
    for _ in range(10):
        feed(floor, 1.0)
    assert feed(floor, 100.0, 20) == 20  # minLimit 20


def test_gradient2_long_rtt_decays_when_far_above_the_sample() -> None:
    gradient2 = Gradient2Limit()
    for _ in range(10):
        feed(gradient2, 10.0)
    feed(gradient2, 1.0)
    expected = 10.0 * (1 - 2 / 601) + 1.0 * 2 / 601
    assert gradient2.long_rtt.value == pytest.approx(expected * 0.95)


# --- Envoy gradient controller ------------------------------------------------------------------------
def envoy_after_min_rtt(min_rtt: float = 1.0) -> EnvoyGradient:
    """A controller started at t = -10 whose first minRTT window ends at t = ``min_rtt``."""
    envoy = EnvoyGradient(jitter=0.0, now=-10.0)
    assert envoy.limit == 3 and envoy.in_min_rtt_window
    for _ in range(49):
        assert envoy.on_request(min_rtt, sample(min_rtt, at=0.0), 3, 2) == 3
    assert envoy.in_min_rtt_window
    envoy.on_request(min_rtt, sample(min_rtt, at=0.0), 3, 2)
    assert not envoy.in_min_rtt_window and envoy.min_rtt == min_rtt
    return envoy


def test_envoy_measures_min_rtt_from_50_requests_at_a_floor_of_3() -> None:
    envoy = envoy_after_min_rtt(2.0)
    assert envoy.limit == 3  # the limit from before the window comes back


def test_envoy_ignores_requests_started_before_the_min_rtt_window() -> None:
    envoy = EnvoyGradient(now=10.0)
    for _ in range(60):
        envoy.on_request(11.0, sample(1.0, at=9.0), 3, 2)
    assert envoy.in_min_rtt_window and envoy.min_rtt is None


def sample_window(envoy: EnvoyGradient, start: float, rtt: float) -> None:
    """One request ending inside the 100 ms sample window that starts at ``start``, then that window's end."""
    envoy.on_request(start + 0.05, sample(rtt, at=start + 0.05 - rtt), 3, 2)
    envoy.step(tick(start + 0.1 + 1e-6))


def test_envoy_limit_is_gradient_times_limit_plus_its_square_root() -> None:
    envoy = envoy_after_min_rtt(1.0)  # the sample windows restart at t = 1.0
    sample_window(envoy, 1.0, 1.0)  # p50 1.0: gradient 1.25 x 1.0 / 1.0
    assert envoy.gradient == pytest.approx(1.25)
    assert envoy.limit == int(3 * 1.25 + (3 * 1.25) ** 0.5)  # 5


def test_envoy_grows_at_most_2x_and_halves_at_most_on_slow_samples() -> None:
    envoy = envoy_after_min_rtt(1.0)
    start = 1.0
    sample_window(envoy, start, 0.1)
    assert envoy.gradient == 2.0 and envoy.limit == int(6 + 6**0.5)  # 8
    while envoy.limit < 40:
        start += 0.1
        sample_window(envoy, start, 0.1)
    before = envoy.limit
    sample_window(envoy, start + 0.1, 3.0)
    assert envoy.gradient == 0.5
    assert envoy.limit == int(before * 0.5 + (before * 0.5) ** 0.5)


def test_envoy_remeasures_min_rtt_every_interval() -> None:
    envoy = envoy_after_min_rtt(1.0)
    envoy.step(tick(60.9))
    assert not envoy.in_min_rtt_window
    envoy.step(tick(61.0 + 1e-6))  # the interval (no jitter here) counts from when the last window ended
    assert envoy.in_min_rtt_window and envoy.limit == 3


def test_envoy_remeasures_min_rtt_after_five_sample_windows_at_the_floor() -> None:
    envoy = envoy_after_min_rtt(1.0)
    start = 1.0
    for _ in range(4):  # slow samples: 3 x 0.5 + sqrt(1.5) = 2.7, clamped to 3
        sample_window(envoy, start, 5.0)
        start += 0.1
    assert envoy.limit == 3 and not envoy.in_min_rtt_window
    sample_window(envoy, start, 5.0)  # the fifth
    envoy.step(tick(start + 0.1 + 2e-6))
    assert envoy.in_min_rtt_window


# --- the harness seam ----------------------------------------------------------------------------------
def test_the_harness_hands_every_finished_request_to_a_request_observer() -> None:
    made: list[AimdLatencyLimit] = []

    def build() -> AimdLatencyLimit:
        made.append(AimdLatencyLimit(initial_limit=40))
        return made[0]

    harness = Harness(get_profile("qwen3.6-35b-a3b-32gb"), AimdConfig(), algorithm=build, seed=1)
    harness.run_phase(Conditions((60,), Workload(prompt=(256, 256), output=(512, 512))), 40.0)
    [aimd] = made
    assert aimd.samples == len(harness.trace.finished) > 40
    assert harness.gateways[0].limit == aimd.limit == 20  # every chat answer took over 5 s
