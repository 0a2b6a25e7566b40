"""Congestion signals, one rule at a time, from hand-built observations on a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.control.algorithm import Reason
from gateway.control.config import AimdConfig
from gateway.control.knee_search.signals import UNJUDGED_MAX_S, CongestionDetector
from gateway.control.observation import GpuHeadroom, Headroom, LimiterState, observe
from gateway.control.window import Outcome, RequestSample, SlidingWindow

CONFIG = AimdConfig()


def base_obs(now: float = 100.0, **changes):
    window = SlidingWindow(10.0)
    stats = window.stats(now)
    obs = observe(now, stats, LimiterState(limit=16, inflight=16, peak_inflight=16, queue_depth=4))
    return replace(obs, **changes)


def judged_on(requests: int) -> dict[str, int]:
    """An observation's latency p99s, TTFT's and TPOT's alike, over this many requests."""
    return {"latency_samples": requests, "ttft_samples": requests}


def reasons(signals) -> list[Reason]:
    return [s.reason for s in signals]


def test_failures_count_at_once_and_halve() -> None:
    detector = CongestionDetector(CONFIG)
    signals = detector.update(base_obs(completed=20, upstream_errors=1, timeouts=1))
    assert reasons(signals) == [Reason.UPSTREAM_ERRORS]
    assert signals[0].factor == CONFIG.error_decrease_factor


def test_a_lone_error_in_a_busy_window_is_noise() -> None:
    detector = CongestionDetector(CONFIG)
    assert detector.update(base_obs(completed=100, upstream_errors=1)) == []


def test_client_cancellations_and_4xx_never_count() -> None:
    window = SlidingWindow(10.0)
    for i, outcome in enumerate([Outcome.CLIENT_CANCELLED, Outcome.CLIENT_ERROR] * 5):
        window.add(
            RequestSample(
                arrived=90 + i * 0.1,
                admitted=90 + i * 0.1,
                finished=95,
                first_token=None,
                prompt_tokens=10,
                output_tokens=0,
                outcome=outcome,
            )
        )
    obs = observe(100.0, window.stats(100.0), LimiterState(16, 16, 16, 4))
    assert obs.completed == 10 and obs.failures == 0
    assert CongestionDetector(CONFIG).update(obs) == []


def test_kv_usage_must_persist_and_a_single_crossing_only_blocks() -> None:
    detector = CongestionDetector(CONFIG)
    high = base_obs(kv_usage=0.97, kv_usage_age_s=1.0)
    assert detector.update(high) == []
    assert detector.blocking(high) is Reason.KV_USAGE
    assert reasons(detector.update(replace(high, now=102.0))) == [Reason.KV_USAGE]
    # back under the line: the streak resets, but above kv_usage_resume increases stay blocked
    calm = base_obs(now=104.0, kv_usage=0.92, kv_usage_age_s=1.0)
    assert detector.update(calm) == []
    assert detector.blocking(calm) is Reason.KV_USAGE
    assert detector.blocking(replace(calm, kv_usage=0.5)) is None


def test_stale_or_missing_backend_metrics_are_ignored_never_fail_closed() -> None:
    detector = CongestionDetector(CONFIG)
    stale = base_obs(
        kv_usage=0.99,
        kv_usage_age_s=60.0,
        backend_waiting=30,
        backend_waiting_age_s=60.0,
        preemptions_total=5.0,
        preemptions_age_s=60.0,
    )
    for tick in range(5):
        stale = replace(stale, now=100.0 + 2 * tick, preemptions_total=5.0 + tick)
        assert detector.update(stale) == []
        assert detector.blocking(stale) is None
    assert detector.update(base_obs()) == []  # nothing known at all


def test_preemptions_rising_is_a_fact_not_a_level() -> None:
    detector = CongestionDetector(CONFIG)
    first = base_obs(preemptions_total=7.0, preemptions_age_s=0.5)
    assert detector.update(first) == []  # the first reading is a baseline, whatever its value
    assert detector.update(replace(first, now=102.0)) == []
    assert reasons(detector.update(replace(first, now=104.0, preemptions_total=9.0))) == [Reason.PREEMPTIONS]
    # a counter reset (backend restarted) is not a preemption
    assert detector.update(replace(first, now=106.0, preemptions_total=0.0)) == []


def test_backend_queue_must_stay_non_empty() -> None:
    detector = CongestionDetector(CONFIG)
    waiting = base_obs(now=100.0, backend_waiting=3, backend_waiting_age_s=1.0)
    assert detector.update(waiting) == []
    assert detector.blocking(waiting) is None  # one scrape after an admission burst is normal
    assert detector.update(replace(waiting, now=103.0)) == []
    assert detector.blocking(replace(waiting, now=103.0)) is Reason.BACKEND_QUEUE
    assert reasons(detector.update(replace(waiting, now=106.0))) == [Reason.BACKEND_QUEUE]
    assert detector.update(replace(waiting, now=108.0, backend_waiting=0)) == []
    assert detector.update(replace(waiting, now=110.0)) == []  # the clock starts again


def test_a_backend_queue_while_this_gateway_sends_nothing_is_not_its_own() -> None:
    """A queue in the backend while nothing of this gateway's runs or waits (another gateway's requests, or
    clients sent straight to the server) cuts nothing, and its time does not count once this gateway sends."""
    detector = CongestionDetector(CONFIG)
    idle = base_obs(now=100.0, backend_waiting=3, backend_waiting_age_s=1.0, inflight=0, peak_inflight=0, queue_depth=0)
    for now in (100.0, 103.0, 106.0, 112.0):
        assert detector.update(replace(idle, now=now)) == []
        assert detector.blocking(replace(idle, now=now)) is None
    busy = base_obs(now=114.0, backend_waiting=3, backend_waiting_age_s=1.0)
    assert detector.update(busy) == []  # its clock starts now, not at 100
    assert detector.update(replace(busy, now=117.0)) == []
    assert reasons(detector.update(replace(busy, now=120.0))) == [Reason.BACKEND_QUEUE]
    # One request of its own in flight at the tick's peak is enough for the queue to be partly its own.
    detector = CongestionDetector(CONFIG)
    one = replace(idle, peak_inflight=1)
    detector.update(one)
    assert reasons(detector.update(replace(one, now=106.0))) == [Reason.BACKEND_QUEUE]


def test_a_limit_increase_restarts_the_backend_queue_clock() -> None:
    detector = CongestionDetector(CONFIG)
    waiting = base_obs(now=100.0, backend_waiting=3, backend_waiting_age_s=1.0)
    detector.update(waiting)
    detector.increased(105.0)
    assert detector.update(replace(waiting, now=106.0)) == []


def test_gpu_memory_floor_cuts_once_then_only_if_it_keeps_falling() -> None:
    detector = CongestionDetector(CONFIG)
    low = base_obs(gpu_memory_free_min=0.02, gpus_age_s=1.0)
    assert detector.update(low) == []
    [signal] = detector.update(replace(low, now=102.0))
    assert signal.reason is Reason.GPU_MEMORY
    detector.decreased(low, signal)
    # still under the floor but not lower: preallocating servers do not give memory back
    assert detector.update(replace(low, now=104.0)) == []
    assert detector.blocking(replace(low, now=104.0)) is Reason.GPU_MEMORY
    assert reasons(detector.update(replace(low, now=106.0, gpu_memory_free_min=0.005))) == [Reason.GPU_MEMORY]


def test_gpu_headroom_from_nvml_readings_through_observe() -> None:
    gpus = (GpuHeadroom(0, 80 * 2**30, 40 * 2**30, 0.5, "a"), GpuHeadroom(1, 80 * 2**30, 2**30, None, "b"))
    obs = observe(100.0, SlidingWindow(10.0).stats(100.0), LimiterState(8, 8, 8, 0), Headroom(gpus=gpus, gpus_at=97.0))
    assert obs.gpu_memory_free_min == pytest.approx(1 / 80)
    assert obs.gpu_utilization_max == 0.5
    assert obs.gpus_age_s == pytest.approx(3.0)


@pytest.mark.parametrize(
    "name,value,slo_name", [("ttft_p99", 4.0, "ttft_p99_slo_s"), ("tpot_p99", 0.2, "tpot_p99_slo_s")]
)
def test_latency_over_its_objective_cuts_in_proportion_once_confirmed(name: str, value: float, slo_name: str) -> None:
    detector = CongestionDetector(CONFIG)
    over = base_obs(**judged_on(CONFIG.min_samples), **{name: value})
    assert detector.update(over) == []
    [signal] = detector.update(replace(over, now=102.0))
    slo = getattr(CONFIG, slo_name)
    assert signal.threshold == slo
    assert signal.factor == pytest.approx(max(0.5, min(CONFIG.decrease_factor, slo / value)))


def test_latency_from_too_few_requests_is_not_judged() -> None:
    detector = CongestionDetector(CONFIG)
    few = base_obs(**judged_on(CONFIG.min_samples - 1), tpot_p99=1.0)
    for tick in range(4):
        assert detector.update(replace(few, now=100.0 + 2 * tick)) == []


def test_ttft_is_judged_on_the_requests_it_is_over() -> None:
    """A burst's requests count towards TPOT but not TTFT: enough requests for TPOT are not enough for a
    TTFT p99 over the few left (the largest of two first tokens is no p99)."""
    detector = CongestionDetector(CONFIG)
    few = base_obs(latency_samples=CONFIG.min_samples, ttft_samples=2, ttft_p99=5.0)
    for tick in range(4):
        assert detector.update(replace(few, now=100.0 + 2 * tick)) == []
    enough = replace(few, ttft_samples=CONFIG.min_samples)
    detector.update(replace(enough, now=110.0))
    [signal] = detector.update(replace(enough, now=112.0))
    assert signal.reason is Reason.TTFT


def cut_on_latency(**latency: float) -> CongestionDetector:
    """A detector whose latency signal (confirmed at t=102) the controller has just acted on."""
    detector = CongestionDetector(CONFIG)
    over = base_obs(**judged_on(CONFIG.min_samples), **latency)
    detector.update(over)
    [signal] = detector.update(replace(over, now=102.0))
    detector.decreased(replace(over, now=102.0), signal)
    return detector


def test_after_a_latency_cut_increases_wait_until_the_objective_is_judged_again() -> None:
    """A cut's evidence restarts with it, and with long answers none of the requests admitted since has
    finished for a minute: a step up in that time would go back over the line before anything could say so
    (the matrix's AWQ deployment, 2x slower, probed back over its TPOT cliff 42 s after the cut)."""
    detector = cut_on_latency(tpot_p99=0.2)
    unjudged = base_obs(now=104.0, **judged_on(CONFIG.min_samples - 1), tpot_p99=None)
    for tick in range(3):
        now = replace(unjudged, now=104.0 + 2 * tick)
        assert detector.update(now) == []
        assert detector.blocking(now) is Reason.TPOT
    judged = base_obs(now=110.0, **judged_on(CONFIG.min_samples), tpot_p99=0.05)
    assert detector.update(judged) == []
    assert detector.blocking(judged) is None


def test_a_latency_cut_that_is_never_judged_again_stops_blocking_in_time() -> None:
    """Traffic that turned to whole answers brings no latency samples: the wait has an end."""
    detector = cut_on_latency(ttft_p99=5.0)
    silent = base_obs(**judged_on(0), ttft_p99=None)
    before = replace(silent, now=102.0 + UNJUDGED_MAX_S - 2.0)
    detector.update(before)
    assert detector.blocking(before) is Reason.TTFT
    after = replace(silent, now=102.0 + UNJUDGED_MAX_S)
    detector.update(after)
    assert detector.blocking(after) is None


def test_requests_in_transit_to_the_next_engine_step_are_not_a_queue() -> None:
    """vLLM reports its waiting gauge per step, and a request that arrives mid-step waits for the next
    one: 1-2 waiting beside 26 running, at every scrape for longer than the persistence, is no queue."""
    detector = CongestionDetector(CONFIG)
    transit = base_obs(
        now=100.0, backend_waiting=2, backend_waiting_age_s=1.0, backend_running=26, backend_running_age_s=1.0
    )
    for now in range(100, 131, 2):
        assert detector.update(replace(transit, now=float(now))) == []
        assert detector.blocking(replace(transit, now=float(now))) is None
    # a queue clearly beyond one step's arrivals (over a tenth of the batch) still counts
    queued = replace(transit, backend_waiting=6)
    assert detector.update(replace(queued, now=132.0)) == []
    assert detector.update(replace(queued, now=135.0)) == []
    assert reasons(detector.update(replace(queued, now=138.0))) == [Reason.BACKEND_QUEUE]
