"""The mean over the recent past that the controller's KV room and TPOT predictor read."""

from __future__ import annotations

from gateway.control.knee_search.timed_mean import TimedMean


def test_the_mean_covers_the_values_read_since_the_time_asked() -> None:
    values = TimedMean(keep_s=100.0)
    for at, value in [(0.0, 1.0), (5.0, 2.0), (10.0, 6.0)]:
        values.add(at, value)
    assert values.mean() == 3.0
    assert values.mean(since=5.0) == 4.0  # a value read at the bound counts
    assert values.mean(since=10.5) is None


def test_values_older_than_the_span_are_forgotten_when_one_is_added_or_on_request() -> None:
    values = TimedMean(keep_s=10.0)
    values.add(0.0, 100.0)
    values.add(10.0, 2.0)  # the first is exactly keep_s old: kept
    assert values.mean() == 51.0
    values.add(10.5, 4.0)
    assert values.mean() == 3.0
    values.forget(30.0)
    assert values.mean() is None


def test_nothing_read_has_no_mean() -> None:
    assert TimedMean(keep_s=10.0).mean() is None
