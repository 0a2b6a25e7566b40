"""The p99 TPOT predictor's answer to "how far back does a step over the objective go"."""

from __future__ import annotations

from gateway.control.knee_search.tpot import TpotPredictor


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
