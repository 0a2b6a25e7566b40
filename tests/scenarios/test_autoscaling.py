"""The backends scaled on the capacity signal against the threshold recipes, in the simulator (issue 39, item 4).

One ramp (half a backend's worth to three backends' worth and back), the same arrivals and the same autoscaler
for each recipe (:mod:`testbed.scenarios.autoscaling`); the ranges are the issue's goal where the model meets it
(fewer backend-minutes than the waiting threshold, no flapping) and, for goodput, what the docs report
(docs/deploy.md, "Scaling the backends on the signal, in the simulator"): the signal's misses are the minutes the
first new backends take to load, and none after. The ramp is a shortened bench ramp (a minute's hold, 12-minute
ramps, a 2-minute peak, a 4-minute tail: 31 simulated minutes, not 55), steeper, so those first minutes weigh more
in its goodput than in the bench's. GPU utilisation's flaw (it reads 100% at any load) is shown on a demand held at half
a backend's worth instead of on the ramp. About 20 s of CPU; the HPA's arithmetic is checked on its own first.
"""

from __future__ import annotations

import pytest

from gateway.control.config import AimdConfig
from gateway.sim.profiles import get_profile
from testbed.scenarios.autoscaling import (
    HPA_DEFAULTS,
    RECIPES,
    SIGNAL_BEHAVIOUR,
    Hpa,
    Ramp,
    Recipe,
    Result,
    direction_changes,
    one_backend_capacity,
    run_recipe,
)
from testbed.scenarios.catalogue import CHAT, QWEN

pytestmark = pytest.mark.timeout(300)


def hpa(behaviour=HPA_DEFAULTS, target: float = 1.0, replicas: int = 1) -> Hpa:
    return Hpa(Recipe("t", "signal", target, behaviour, True), replicas, 1, 8)


def test_hpa_skips_a_change_within_its_tolerance_and_holds_without_a_metric() -> None:
    scaler = hpa(replicas=5)
    assert scaler.sync(0.0, 5.4) == 5  # 5.4 / 5 = 1.08: within 10%
    assert scaler.sync(15.0, None) == 5  # no metric: ScalingActive false, the count holds
    assert scaler.sync(30.0, 5.6) == 6  # 1.12: outside it, ceil(5.6)


def test_hpa_default_scale_down_waits_for_its_window_then_drops_at_once() -> None:
    scaler = hpa(target=5.0, replicas=1)
    assert scaler.sync(0.0, 40.0) == 5  # up at once, by 100% or 4 pods per 15 s, whichever is more
    assert scaler.sync(15.0, 40.0) == 8  # and again the next period, to maxReplicas
    for t in range(30, 315, 15):
        assert scaler.sync(float(t), 0.0) == 8, t  # the highest recommendation of the last 300 s
    assert scaler.sync(316.0, 0.0) == 1  # the window passed: 100% per 15 s, straight to minReplicas


def test_the_manifests_behaviour_paces_both_ways() -> None:
    scaler = hpa(SIGNAL_BEHAVIOUR)
    assert scaler.sync(0.0, 10.0) == 5  # 4 pods per 60 s
    assert scaler.sync(30.0, 10.0) == 5
    assert scaler.sync(61.0, 10.0) == 8
    assert scaler.sync(100.0, 2.0) == 8  # the 60 s window holds the 10
    assert scaler.sync(130.0, 2.0) == 7  # then one pod per 120 s
    assert scaler.sync(200.0, 2.0) == 7
    assert scaler.sync(251.0, 2.0) == 6


def test_direction_changes_count_reversals() -> None:
    assert direction_changes([2, 4, -1, -1]) == 1
    assert direction_changes([7, -7, 7, -7]) == 3
    assert direction_changes([]) == 0


#: The bench's ramp (bench/autoscaling.py) shortened: the same low and high, a steeper slope, a shorter peak.
SHORT = {"hold_s": 60.0, "ramp_s": 720.0, "peak_s": 120.0, "tail_s": 240.0}


@pytest.fixture(scope="module")
def capacity() -> float:
    return one_backend_capacity(QWEN, CHAT, AimdConfig())


@pytest.fixture(scope="module")
def outcomes(capacity: float) -> dict[str, Result]:
    ramp = Ramp(capacity, **SHORT)
    profile = get_profile(QWEN)
    return {
        recipe.name: run_recipe(recipe, profile, ramp, CHAT, config=AimdConfig())
        for recipe in RECIPES
        if recipe.name in ("signal", "waiting")
    }


def test_every_recipe_sees_the_same_arrivals(outcomes: dict[str, Result]) -> None:
    assert len({result.requests for result in outcomes.values()}) == 1


def test_the_signal_uses_fewer_backend_minutes_than_the_waiting_threshold(outcomes: dict[str, Result]) -> None:
    signal = outcomes["signal"]
    # it scaled to the peak (3.75 backends' worth at 0.8; one more on this steeper ramp's way up), not past it
    assert 3 <= signal.max_backends <= 5, signal
    assert signal.backend_minutes < 0.75 * outcomes["waiting"].backend_minutes, outcomes


def test_the_signal_does_not_flap_and_the_waiting_threshold_does(outcomes: dict[str, Result]) -> None:
    assert not outcomes["signal"].flapping, outcomes["signal"]
    assert outcomes["waiting"].flapping, outcomes["waiting"]  # the recipe's flaw, as the docs show it


def test_the_signals_misses_are_the_first_scale_up_and_beat_the_waiting_threshold(
    outcomes: dict[str, Result],
) -> None:
    signal, waiting = outcomes["signal"], outcomes["waiting"]
    assert signal.goodput > waiting.goodput, outcomes
    assert 0.75 <= signal.goodput < 1.0, signal
    # the minutes whose p99 TTFT is over the objective: one spell, the queue that builds while the first new
    # backends load, over before the demand's peak; the waiting threshold misses again after dropping the pool
    slo = AimdConfig().ttft_p99_slo_s or 2.0
    peak_minute = (SHORT["hold_s"] + SHORT["ramp_s"]) / 60
    over = [t / 60 for t, p99 in signal.ttft_by_minute if p99 is not None and p99 > slo]
    assert over and over == [over[0] + i for i in range(len(over))] and over[-1] < peak_minute, over
    waiting_over = [t / 60 for t, p99 in waiting.ttft_by_minute if p99 is not None and p99 > slo]
    assert any(m >= peak_minute for m in waiting_over), waiting_over


def test_gpu_utilisation_grows_the_pool_at_half_a_backends_worth_and_the_signal_does_not(capacity: float) -> None:
    held = Ramp(capacity, high=0.5, hold_s=600.0, ramp_s=0.0, peak_s=0.0, tail_s=0.0)
    profile = get_profile(QWEN)
    by_name = {recipe.name: recipe for recipe in RECIPES}
    signal = run_recipe(by_name["signal"], profile, held, CHAT)
    gpu = run_recipe(by_name["gpu_util"], profile, held, CHAT)
    # one backend never saturated: no figure, the count holds at one
    assert signal.max_backends == 1 and signal.goodput > 0.95, signal
    # an engine with any work reads 100%: the pool grows though one backend had room
    assert gpu.max_backends >= 3 and gpu.backend_minutes > 2 * signal.backend_minutes, gpu
