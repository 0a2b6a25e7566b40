"""The capacity signal's arithmetic (gateway/control/capacity_signal.py; docs/deploy.md, "The capacity signal"):
capacity only from windows spent at the limit, the pool's median, demand counted from completions and the
backlog's growth, the backends wanted, and a hysteresis that goes up at once and down only after a hold."""

from __future__ import annotations

import pytest

from gateway.control.capacity_signal import CapacitySignal, Hysteresis, ModelSignal, Reading, wanted_backends


def reading(
    upstream: str = "a",
    *,
    model: str = "m",
    saturated: bool = True,
    goodput: float = 10.0,
    tokens: float = 1000.0,
    finished: tuple[float, ...] = (),
    backlog: int = 0,
) -> Reading:
    return Reading(
        upstream=upstream,
        model=model,
        saturated=saturated,
        goodput_requests_per_s=goodput,
        output_tokens_per_s=tokens,
        finished=finished,
        backlog=backlog,
        window_s=10.0,
    )


def spread(count: int, start: float = 0.0, end: float = 10.0) -> tuple[float, ...]:
    """``count`` requests ending evenly within ``(start, end]``."""
    return tuple(start + (end - start) * (i + 1) / count for i in range(count))


def only(signals: list[ModelSignal]) -> ModelSignal:
    (signal,) = signals
    return signal


def test_wanted_is_the_ceiling_of_demand_over_target_times_capacity() -> None:
    assert wanted_backends(16.0, 10.0, 0.8) == 2  # 16 / 8 = 2 exactly: not 3 by rounding noise
    assert wanted_backends(16.1, 10.0, 0.8) == 3
    assert wanted_backends(0.0, 10.0, 0.8) == 1  # a served model keeps one backend
    assert wanted_backends(24.0, 10.0, 1.0) == 3
    with pytest.raises(ValueError):
        wanted_backends(1.0, 0.0, 0.8)


def test_no_measurement_yet_exports_demand_but_no_capacity_or_desired() -> None:
    signal = CapacitySignal(0.8, 300.0, settle_s=10.0)
    first = only(signal.step(0.0, [reading(saturated=False, goodput=3.0)]))
    assert first.demand_requests_per_s is None  # one reading: no span yet
    later = only(signal.step(2.0, [reading(saturated=False, goodput=3.0, finished=(-0.5, *spread(6, 0.0, 2.0)))]))
    assert later.demand_requests_per_s == pytest.approx(3.0)
    assert later.capacities == {} and later.pool_requests_per_s is None and later.pool_tokens_per_s is None
    assert later.wanted is None and later.desired is None


def test_capacity_counts_only_once_the_limit_bound_for_a_whole_window() -> None:
    signal = CapacitySignal(0.8, 300.0, settle_s=10.0)
    signal.step(0.0, [reading(goodput=5.0)])
    assert signal.capacity("a") is None  # saturated since 0: the window still holds unsaturated time
    signal.step(6.0, [reading(saturated=False, goodput=6.0)])  # the limit stopped binding: start again
    signal.step(8.0, [reading(goodput=7.0)])
    signal.step(16.0, [reading(goodput=8.0)])
    assert signal.capacity("a") is None
    signal.step(18.0, [reading(goodput=9.0, tokens=900.0)])
    capacity = signal.capacity("a")
    assert capacity is not None and (capacity.requests_per_s, capacity.tokens_per_s) == (9.0, 900.0)
    # idle afterwards: the capacity stays what was measured at the limit
    signal.step(20.0, [reading(saturated=False, goodput=0.5)])
    assert signal.capacity("a") == capacity


def test_a_fresh_saturated_backend_is_measured_only_in_steady_state() -> None:
    # "a" has served at its limit for long: 10 in flight, one ending every second (1 request/s). "b" joins a
    # queued pool at t=100 and takes 10 at once; its first requests end one a second from 108 to 117, and from
    # then on it too ends one a second (its 10 slots turned over, each request 10 s long).
    def ends(first: float, now: float) -> tuple[float, ...]:
        return tuple(float(t) for t in range(int(first), int(now) + 1) if now - 10.0 < t <= now)

    def readings(now: float) -> list[Reading]:
        a_ends, b_ends = ends(0.0, now), ends(108.0, now)
        return [
            reading("a", goodput=len(a_ends) / 10.0, finished=a_ends, backlog=10),
            reading("b", goodput=len(b_ends) / 10.0, finished=b_ends, backlog=10),
        ]

    signal = CapacitySignal(0.8, 300.0, settle_s=10.0)
    for now in range(60, 100, 2):  # "a" alone, watched from t=60: turned over by 70, measured at 80
        out = only(signal.step(float(now), readings(float(now))[:1]))
    assert out.pool_requests_per_s == 1.0
    ticks = [100.0 + 2.0 * k for k in range(20)]
    pools: dict[float, float | None] = {}
    for now in ticks:
        pools[now] = only(signal.step(now, readings(now))).pool_requests_per_s
        if now == 110.0:
            # saturated for settle_s, but its window holds only the 3 requests ended since 108: 0.3 requests/s, the
            # under-reading a window taken settle_s after the limit began binding would keep
            assert readings(now)[1].goodput_requests_per_s == pytest.approx(0.3)
        # its 10th completion came at 117, seen at the tick of 118; a steady window is complete at 128
        assert (signal.capacity("b") is None) == (now < 128.0), now
        capacity = signal.capacity("b")
        assert capacity is None or capacity.requests_per_s == pytest.approx(1.0), (now, capacity)
    # the pool's median was never dragged down by the fresh backend's first windows
    assert set(pools.values()) == {1.0}


def test_a_backlog_that_grows_no_faster_than_requests_end_owes_no_turnover() -> None:
    # in flight 0, 2, 4, ... up to the limit of 10 while one request ends every second: every admission beyond
    # the first made room for by a completion, so the limit binding from t=10 gives a steady window at t=20
    signal = CapacitySignal(0.8, 300.0, settle_s=10.0)
    for now in range(0, 22, 2):
        finished = tuple(float(t) for t in range(1, now + 1) if now - 10 < t)
        signal.step(
            float(now),
            [reading(saturated=now >= 10, goodput=len(finished) / 10.0, finished=finished, backlog=min(10, now))],
        )
        assert (signal.capacity("a") is None) == (now < 20), now


def test_the_pool_capacity_is_the_median_and_demand_counts_the_growing_backlog() -> None:
    signal = CapacitySignal(0.8, 300.0, settle_s=0.0)
    ups = [("a", 8.0, 800.0), ("b", 10.0, 1000.0), ("c", 30.0, 3000.0)]
    signal.step(0.0, [reading(u, goodput=g, tokens=t) for u, g, t in ups], {"m": 0})
    out = only(
        signal.step(
            10.0,
            [reading(u, goodput=g, tokens=t, backlog=4, finished=spread(int(g * 10))) for u, g, t in ups],
            {"m": 18},
        )
    )
    assert out.pool_requests_per_s == 10.0 and out.pool_tokens_per_s == 1000.0  # the outlier c does not move it
    # completions 48/s, plus a backlog that grew by 30 (12 in flight + 18 queued) in 10 s: 51 arrivals/s
    assert out.demand_requests_per_s == pytest.approx(51.0)
    assert out.all_saturated and out.upstreams == 3
    assert out.wanted == 7 and out.desired == 7  # ceil(51 / 8)


def test_every_backend_at_its_cap_asks_for_at_least_one_more() -> None:
    # u = 1 and a demand the backends exactly meet: the arithmetic alone says 2, but requests wait on both
    signal = CapacitySignal(1.0, 300.0, settle_s=0.0)
    signal.step(0.0, [reading("a", backlog=4), reading("b", backlog=4)], {"m": 10})
    out = only(signal.step(10.0, [reading(u, backlog=4, finished=spread(100)) for u in ("a", "b")], {"m": 10}))
    assert out.demand_requests_per_s == pytest.approx(20.0)
    assert out.all_saturated and out.wanted == 3 and out.desired == 3


def test_hysteresis_goes_up_at_once_and_down_after_the_hold_to_the_highest_figure_meanwhile() -> None:
    h = Hysteresis(hold_s=60.0)
    assert h.step(0.0, 2) == 2
    assert h.step(1.0, 5) == 5  # up at once
    assert h.step(10.0, 2) == 5  # a lower figure starts the hold
    assert h.step(40.0, 3) == 5
    assert h.step(69.0, 2) == 5
    assert h.step(70.0, 2) == 3  # held 60 s: down, but only to the highest figure wanted during the hold
    assert h.step(100.0, 2) == 3  # still lower: a new hold started at 70
    assert h.step(130.0, 2) == 2
    assert h.step(131.0, 4) == 4


def test_a_dip_shorter_than_the_hold_never_removes_a_backend() -> None:
    h = Hysteresis(hold_s=60.0)
    h.step(0.0, 4)
    figures = [h.step(t, 4 if (t // 50) % 2 else 2) for t in range(1, 600, 5)]
    assert set(figures) == {4}


def test_demand_counts_from_the_oldest_tick_inside_the_window() -> None:
    signal = CapacitySignal(0.8, 300.0, settle_s=0.0)
    signal.step(0.0, [reading(backlog=50)])  # outside the window by the last tick: not the base
    signal.step(4.0, [reading(backlog=2)])
    out = only(signal.step(12.0, [reading(backlog=6, finished=(3.0, *spread(16, 4.0, 12.0)))]))
    # since 4.0: 16 finished (the one at 3.0 is before), the backlog grew by 4: 20 arrivals in 8 s
    assert out.demand_requests_per_s == pytest.approx(
        2.5
    )  # demand flapping every 50 s: the desired figure does not flap


def test_models_are_apart_and_a_vanished_upstream_is_forgotten() -> None:
    signal = CapacitySignal(0.8, 300.0, settle_s=0.0)
    signal.step(0.0, [reading("a", model="x", goodput=10.0), reading("b", model="y", goodput=2.0)])
    x, y = signal.step(1.0, [reading("a", model="x", goodput=10.0), reading("b", model="y", goodput=2.0)])
    assert (x.model, x.pool_requests_per_s, y.model, y.pool_requests_per_s) == ("x", 10.0, "y", 2.0)
    (x,) = signal.step(2.0, [reading("a", model="x", goodput=10.0)])
    assert signal.capacity("b") is None and x.model == "x"


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        CapacitySignal(0.0, 300.0, 10.0)
    with pytest.raises(ValueError):
        CapacitySignal(1.5, 300.0, 10.0)
    with pytest.raises(ValueError):
        CapacitySignal(0.8, -1.0, 10.0)
