"""The matrix's reference column (``bench.baselines``): the oracle's best static limit of each phase, switched at
the phase's start. It is what any limit could reach in a cell, so the goals read misses against it and never
count it as an alternative."""

from __future__ import annotations

import pytest

from bench.baselines import CONTROLLER, SWITCHED, PhaseSchedule, Run, matrix_goals
from gateway.control.algorithm import Action, LimitAlgorithm
from gateway.control.observation import Headroom, LimiterState, Observation, observe
from gateway.control.window import SlidingWindow
from testbed.scenarios.catalogue import PhaseResult
from testbed.scenarios.evaluate import Oracle, StaticPoint


def tick(now: float) -> Observation:
    return observe(now, SlidingWindow(10.0).stats(now), LimiterState(1, 0, 0, 0), Headroom())


def test_a_schedule_holds_each_phases_limit_from_its_start() -> None:
    schedule: LimitAlgorithm = PhaseSchedule([(150.0, 27), (0.0, 59), (300.0, 59)])
    assert schedule.limit == 59  # before the first tick: the first phase's
    seen = [(now, schedule.step(tick(now))) for now in (2.0, 148.0, 150.0, 152.0, 300.0)]
    assert [(now, d.limit) for now, d in seen] == [(2.0, 59), (148.0, 59), (150.0, 27), (152.0, 27), (300.0, 59)]
    assert [d.action for _, d in seen] == [Action.HOLD, Action.HOLD, Action.DECREASE, Action.HOLD, Action.INCREASE]


@pytest.mark.parametrize("schedule", [[], [(0.0, 0)], [(0.0, 8), (10.0, -1)], [(5.0, 8)]])
def test_a_schedule_needs_a_limit_of_at_least_one_from_time_0_on(schedule: list[tuple[float, int]]) -> None:
    with pytest.raises(ValueError):
        PhaseSchedule(schedule)


def cell(scheme: str, scenario: str, ratio: float) -> Run:
    """One phase whose goodput is ``ratio`` of its oracle's best."""
    best = StaticPoint(limit=10, goodput=100.0, tokens_per_s=100.0, preemptions=0, tpot_p99=None)
    oracle = Oracle(points=(best,), best=best, sweet_spot=10, preemption_onset=None)
    phase = PhaseResult(
        scenario=scenario,
        phase="overload",
        start=0.0,
        end=200.0,
        checks=("goodput",),
        oracle=oracle,
        band=(8.0, 12.0),
        limits=[[]],
        settled=None,
        convergence_s=None,
        goodput=100 * ratio,
        goodput_ratio=ratio,
        tpot_p99=None,
        preemptions=0,
    )
    return Run(scheme, scenario, [phase])


def test_the_goals_read_misses_against_the_reference_and_never_count_it_as_an_alternative() -> None:
    ratios = {
        "d.steady_overload": {CONTROLLER: 0.70, SWITCHED: 0.85, "static_16": 0.50},
        "d.load_steps": {CONTROLLER: 0.95, SWITCHED: 1.00, "static_16": 0.60},
    }
    outcomes = {sc: {name: cell(name, sc, r) for name, r in by.items()} for sc, by in ratios.items()}
    goals = matrix_goals(outcomes, (CONTROLLER, SWITCHED, "static_16"))
    # Counted as an alternative, the reference (never under 0.7, worst 0.85) would miss goal 2 and make goal 3's
    # best worst cell 0.85.
    assert "Goal 2, every alternative below 0.7x in at least one deployment: **holds**." in goals
    assert "the best worst among the others is static 16 (a guess)'s 0.50" in goals
    assert "it reaches 0.9x the oracle in 1 of 2 cells (not in d.steady_overload)" in goals
    assert "the controller is at >= 0.9x the reference in 1 of 2: short in d.steady_overload (0.82)." in goals
