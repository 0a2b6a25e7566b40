"""The p99 TPOT predictor: what it learns from the requests that finish, and how far back a step over the objective
goes."""

from __future__ import annotations

from dataclasses import replace

from gateway.control.knee_search.tpot import TpotPredictor
from gateway.control.observation import LimiterState, Observation, observe
from gateway.control.window import SlidingWindow


def calibrated(scale: float) -> TpotPredictor:
    tpot = TpotPredictor(min_samples=20)
    tpot.scale = scale
    return tpot


def test_a_step_that_streamed_more_keeps_the_largest_limit_the_line_between_its_readings_allows() -> None:
    """32 at 3,000 tokens/s and 40 at 3,200: on the line between them, 1.2 * 37 / 3,125 = 0.0142 is within 0.0143
    and 1.2 * 38 / 3,150 = 0.0145 over it."""
    assert calibrated(1.2).largest_within(0.0143, 32, 3000.0, 40, 3200.0) == 37


def test_a_step_that_streamed_no_more_than_its_base_goes_back_to_the_base() -> None:
    """Past a cliff the line slopes down; 37 on it (1.2 * 37 / 2,812 = 0.0158) would predict within the
    objective, but its slots bought no tokens, and past the cliff is where the prediction is least trusted."""
    tpot = calibrated(1.2)
    assert tpot.largest_within(0.016, 32, 3000.0, 40, 2700.0) == 32
    assert tpot.largest_within(0.016, 32, 3000.0, 40, 3000.0) == 32


def test_before_calibration_nothing_is_predicted_within_the_objective() -> None:
    assert TpotPredictor(min_samples=20).largest_within(1.0, 32, 3000.0, 40, 3200.0) == 32


def window(now: float, limit: int, tokens_per_s: float, tpot_p99: float) -> Observation:
    """Ten seconds in which 12 requests finished (with a limit of 55, each lived about 46 s) at ``tpot_p99``."""
    base = observe(now, SlidingWindow(10.0).stats(now), LimiterState(limit, limit, limit, 10))
    return replace(base, tokens_per_s=tokens_per_s, tpot_p99=tpot_p99, latency_samples=12, completed=12)


def test_after_a_step_up_p99_tpot_of_requests_that_ran_before_it_does_not_lower_the_calibration() -> None:
    """Five minutes at 55 (620 tokens/s, p99 TPOT 1.05x the per-slot interval), then 20 s at 67 (650 tokens/s)
    during which the requests that finish are those that lived ~46 s, mostly at 55: their p99 is still 55's.
    Paired with 67's per-slot rate, they would pull the ratio down to 0.91, and predict 0.094 s at 67 (within
    the 0.1 s objective) against the 0.108 s it brings; paired with the rate they streamed at, the ratio stays
    near 1.05."""
    tpot = TpotPredictor(min_samples=10)
    at_55 = 1.05 * 55 / 620
    for tick in range(1, 141):
        tpot.limit_set(2.0 * tick - 2.0, 55)
        tpot.calibrate(window(2.0 * tick, 55, 620.0, at_55), bottleneck=True)
    tpot.limit_set(280.0, 67)
    for now in range(282, 302, 2):
        tpot.calibrate(window(float(now), 67, 650.0, at_55), bottleneck=True)
    assert tpot.scale is not None and abs(tpot.scale - 1.05) < 0.03
    predicted = tpot.predict(67, 650.0)
    assert predicted is not None and predicted > 0.1
