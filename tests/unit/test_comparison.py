"""``testbed.closed_loop.Comparison``: how the real-server tests judge the controller against static limits run
in the same test (the median of round-by-round ratios, or the same limit through every measured run)."""

from __future__ import annotations

import math

from testbed.closed_loop import Comparison

RUNS = {"controller": [100.0, 80.0, 95.0], "static 11": [100.0, 100.0, 100.0], "static 22": [50.0, 0.0, 40.0]}


def test_paired_is_the_median_of_round_by_round_ratios() -> None:
    paired = Comparison(RUNS).paired
    assert paired["static 11"] == 0.95
    assert paired["static 22"] == 2.375  # 2.0, inf (nothing delivered), 2.375


def test_a_ratio_at_or_over_the_floor_holds_whatever_the_limit() -> None:
    comparison = Comparison(RUNS)
    assert comparison.holds("static 11", settled=[9, 10, 12])
    assert not comparison.holds("static 11", settled=[9, 10, 12], floor=0.96)


def test_the_same_limit_through_every_measured_run_holds_whatever_the_ratio() -> None:
    comparison = Comparison({"controller": [70.0, 75.0, 80.0], "static 11": [100.0] * 3, "static 22": [10.0] * 3})
    assert comparison.holds("static 11", settled=[11] * 30)
    assert not comparison.holds("static 11", settled=[11] * 29 + [10])  # one look at another limit
    assert not comparison.holds("static 11", settled=[])  # nothing looked at: only the ratio counts
    assert comparison.holds("static 22", settled=[11] * 30)  # on its ratio: 7-8x


def test_the_best_static_is_the_one_compared_worst_with() -> None:
    comparison = Comparison({"controller": [70.0] * 3, "static 11": [100.0] * 3, "static 22": [80.0] * 3})
    assert comparison.best_static == "static 11"
    assert comparison.holds_the_best_static(settled=[11, 11])
    assert not comparison.holds_the_best_static(settled=[10, 11])
    assert math.isclose(comparison.paired["static 22"], 0.875)
