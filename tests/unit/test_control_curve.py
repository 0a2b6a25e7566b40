"""The measured throughput curve: pooling readings, rescaling on a backend change, reading the knee."""

from __future__ import annotations

import pytest

from gateway.control.curve import Curve, _crossing


def curve_of(points: dict[int, float], settled: bool = True) -> Curve:
    curve = Curve()
    for limit, rate in points.items():
        curve.add(limit, rate, 0.0, settled=settled)
    return curve


def test_readings_pool_per_limit() -> None:
    curve = Curve()
    for rate in (1000.0, 1020.0, 980.0):
        curve.add(32, rate, 1.0)
    assert curve.rate(32) == pytest.approx(1000.0)
    assert curve.weight(32) == 3


def test_a_first_reading_stands_in_until_a_settled_one_replaces_it() -> None:
    curve = Curve()
    curve.add(32, 1300.0, 1.0, settled=False)  # right after a doubling: requests in step, fast
    assert not curve.settled(32)
    curve.add(32, 1230.0, 2.0)
    assert curve.settled(32) and curve.rate(32) == 1230.0
    curve.add(32, 1400.0, 3.0, settled=False)  # a later first reading never moves a settled point
    assert curve.rate(32) == 1230.0


def test_one_deviating_reading_is_a_transient_two_rescale_the_curve() -> None:
    curve = curve_of({16: 950.0, 32: 1230.0, 48: 1290.0})
    assert not curve.add(32, 600.0, 10.0)  # a transient (a preemption's recompute) changes nothing
    assert curve.rate(32) == 1230.0
    assert curve.add(32, 615.0, 12.0)  # twice: the backend got 2x slower
    assert curve.rate(16) == pytest.approx(475.0)
    assert curve.rate(48) == pytest.approx(645.0)
    assert not curve.settled(48)  # scaled readings stand in until measured again


def test_a_new_limit_far_outside_its_neighbours_counts_as_a_deviation() -> None:
    curve = curve_of({16: 950.0, 48: 1290.0})
    assert not curve.add(32, 2500.0, 10.0)
    assert curve.add(40, 2600.0, 12.0)  # two in a row, both far above what the curve allows


def test_isotonic_fit_pools_noise_on_the_flat_top() -> None:
    curve = curve_of({16: 950.0, 32: 1260.0, 40: 1240.0, 48: 1250.0})
    fitted = dict(curve.fitted())
    assert fitted[16] == 950.0
    assert fitted[32] == fitted[40] == pytest.approx(1250.0)  # the dip is noise: pooled
    best = curve.best()
    assert best is not None and best[1] == pytest.approx(1250.0)


def test_knee_is_the_smallest_limit_near_the_best_and_reads_the_curve_as_concave() -> None:
    curve = curve_of({8: 560.0, 16: 950.0, 32: 1230.0, 40: 1270.0, 48: 1290.0})
    knee, bracketed = curve.knee(0.95)  # type: ignore[misc]
    assert bracketed
    assert 24 <= knee <= 32
    low, high = 16, 32
    linear = low + (0.95 * 1290 - 950) / (1230 - 950) * (high - low)
    assert knee <= linear + 1  # the concave reading never puts the knee after the straight line's


def test_knee_not_bracketed_when_even_the_lowest_limit_reaches_it() -> None:
    curve = curve_of({30: 1200.0, 40: 1210.0})
    assert curve.knee(0.95) == (30, False)


def test_crossing_between_two_readings() -> None:
    assert _crossing(16, 800.0, 32, 1200.0, 800.0) == pytest.approx(16.0)
    assert _crossing(16, 800.0, 32, 1200.0, 1200.0) == pytest.approx(32.0)
    middle = _crossing(16, 800.0, 32, 1200.0, 1000.0)
    assert 16 < middle < 24  # concave: halfway in throughput comes before halfway in limit


def test_readings_of_a_congested_limit_are_forgotten() -> None:
    curve = curve_of({16: 950.0, 32: 1230.0, 64: 900.0})
    curve.forget_above(40)
    assert sorted(curve.points) == [16, 32]
    assert curve.as_dict() == {"16": 950.0, "32": 1230.0}
