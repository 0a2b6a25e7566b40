"""The measured throughput curve: pooling readings, rescaling on a backend change, reading the knee."""

from __future__ import annotations

import pytest

from gateway.control.knee_search.curve import Curve, _crossing


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


def test_a_sweep_seeds_the_curve_and_local_readings_outweigh_it() -> None:
    curve = Curve()
    curve.seed([(16, 905.0), (24, 1080.0), (32, 1156.0), (48, 1202.0)])
    found = curve.knee(0.97)
    assert found is not None and found[1] and 32 < found[0] < 48  # bracketed from the start
    for now in (10.0, 20.0, 30.0):
        curve.add(32, 1100.0, now)  # within 12% of the sweep's reading: pooled, and it dominates
    assert curve.rate(32) is not None and 1100.0 < curve.rate(32) < 1120.0


def test_first_readings_of_uncertain_world_are_dropped_on_a_rescale() -> None:
    curve = curve_of({16: 900.0, 32: 1150.0, 48: 1200.0})
    curve.add(24, 540.0, 5.0, settled=False)  # a first reading: the old backend or the new one?
    assert not curve.add(32, 575.0, 10.0)
    assert curve.add(32, 580.0, 20.0)  # two readings at half: the backend got 2x slower
    assert 24 not in curve.points
    assert curve.rate(16) == pytest.approx(900.0 * 580.0 / 1150.0)


def test_an_estimate_is_measured_around_only_between_settled_readings() -> None:
    curve = curve_of({8: 800.0, 16: 1000.0})
    curve.add(4, 700.0, 50.0, settled=False)  # slow start's first reading
    assert curve.measured_around(8) and curve.measured_around(12)
    assert not curve.measured_around(6)  # below: only the first reading at 4
    assert not curve.measured_around(20)  # above the highest settled reading
