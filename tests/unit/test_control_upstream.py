"""The observation builder and the per-upstream controller the gateway ticks (decision log, state view)."""

from __future__ import annotations

import json

import pytest

from gateway.control.algorithm import Action, Decision, Reason
from gateway.control.config import AimdConfig, StartPoint
from gateway.control.controller import UpstreamControl
from gateway.control.observation import GpuHeadroom, Headroom, Latency, LimiterState, Observation, observe
from gateway.control.window import Outcome, RequestSample, SlidingWindow


def sample(admitted: float, *, ttft: float = 0.2, dur: float = 5.0, out: int = 101) -> RequestSample:
    return RequestSample(
        arrived=admitted - 1.0,
        admitted=admitted,
        finished=admitted + dur,
        first_token=admitted + ttft,
        prompt_tokens=100,
        output_tokens=out,
        outcome=Outcome.OK,
    )


def test_observe_folds_the_tick_inputs_with_ages() -> None:
    window = SlidingWindow(10.0)
    for i in range(4):
        window.add(sample(90.0 + i))
    window.add_tokens(99.5, 400)
    headroom = Headroom(
        gpus=(GpuHeadroom(0, 100, 25, 0.9),),
        gpus_at=95.0,
        kv_usage=0.5,
        backend_running=7,
        backend_waiting=0,
        preemptions_total=3.0,
        backend_at=99.0,
    )
    obs = observe(100.0, window.stats(100.0), LimiterState(8, 6, 8, 2), headroom, hard_cap=0, tokens_total=400)
    assert obs.tokens_total == 400 and obs.completed == 4 and obs.latency_samples == 4
    assert obs.ttft_p99 == pytest.approx(0.2)  # net of the gateway's queue (1 s here)
    assert obs.hard_cap is None  # 0 means "unknown"
    assert obs.kv_usage_age_s == pytest.approx(1.0) and obs.gpus_age_s == pytest.approx(5.0)
    assert obs.gpu_memory_free_min == 0.25
    assert obs.bottleneck  # a queue
    assert json.dumps(obs.as_dict())


def test_unknown_headroom_has_no_age() -> None:
    obs = observe(5.0, SlidingWindow(10.0).stats(5.0), LimiterState(8, 2, 3, 0))
    assert obs.kv_usage is None and obs.kv_usage_age_s is None and obs.gpus_age_s is None
    assert not obs.bottleneck  # nothing queued, in-flight never reached the limit


def test_latency_of_chosen_samples() -> None:
    both = [sample(1.0, ttft=0.1), sample(2.0, ttft=0.3)]
    latency = Latency.of(both)
    assert latency.samples == latency.ttft_samples == 2 and latency.ttft_p99 == pytest.approx(0.298)
    first_only = Latency.of(both, both[:1])  # TTFT over the first request, TPOT over both
    assert (first_only.samples, first_only.ttft_samples, first_only.ttft_p99) == (2, 1, pytest.approx(0.1))


def test_tick_reads_the_window_and_the_cumulative_token_count() -> None:
    control = UpstreamControl("http://b:8000", AimdConfig(), initial_limit=8)
    window = SlidingWindow(10.0)
    window.add_tokens(1.0, 100)
    decision = control.tick(2.0, window, LimiterState(8, 8, 8, 3))
    assert decision.inputs["tokens_total"] == window.tokens_total == 100
    assert control.last_stats is not None and control.last_stats.output_tokens == 100


def test_latency_evidence_restarts_at_each_decrease() -> None:
    config = AimdConfig(min_samples=3)
    control = UpstreamControl("u", config, initial_limit=20)
    window = SlidingWindow(30.0)
    for now in range(2, 10, 2):  # busy from the start: only the first clients' burst is left out
        control.tick(float(now), window, LimiterState(20, 20, 20, 10))
    for i in range(5):  # slow requests admitted under the old limit
        window.add(sample(10.0 + i, ttft=5.0, dur=8.0))
    state = LimiterState(20, 20, 20, 10)
    first = control.tick(24.0, window, state)
    second = control.tick(26.0, window, state)
    assert first.action is Action.HOLD and second.reason is Reason.TTFT and second.action is Action.DECREASE
    # the same old requests do not count against the new limit
    for now in (28.0, 30.0, 40.0):
        assert control.tick(now, window, LimiterState(second.limit, 10, 10, 10)).reason is not Reason.TTFT


def test_decision_log_folds_repeated_holds_and_the_state_is_json() -> None:
    control = UpstreamControl("u", AimdConfig(), initial_limit=8, start=StartPoint(8, 900.0), log_size=5)
    window = SlidingWindow(10.0)
    for tick in range(1, 30):
        control.tick(tick * 2.0, window, LimiterState(8, 2, 2, 0))  # no demand: hold
    log = control.decisions()
    assert len(log) == 1 and log[0]["reason"] == "no_demand" and log[0]["count"] == 29
    assert log[0]["until"] == 58.0
    state = json.loads(json.dumps(control.state()))
    assert state["limit"] == 8 and state["start"] == {"limit": 8, "peak_tokens_per_s": 900.0}
    assert state["algorithm"]["phase"] == "cruise" and state["config"]["knee_fraction"] == 0.97


def test_log_fields_of_a_limit_change() -> None:
    control = UpstreamControl("u", AimdConfig(), initial_limit=16)
    decision = control.tick(2.0, SlidingWindow(10.0), LimiterState(16, 16, 16, 4), hard_cap=10)
    assert decision.changed
    fields = control.log_fields(decision)
    assert fields["event"] == "limit_change" and fields["limit"] == 10 and fields["previous"] == 16
    assert fields["reason"] == "hard_cap" and fields["queue_depth"] == 4
    assert json.dumps(fields)


def test_config_from_settings_takes_every_knob() -> None:
    from gateway.settings import Settings

    settings = Settings(tpot_p99_slo_s=0.05, knee_fraction=0.9, gpus="0,2", limit_max=64)
    config = AimdConfig.from_settings(settings)
    assert config.tpot_p99_slo_s == 0.05 and config.knee_fraction == 0.9 and config.limit_max == 64
    assert settings.gpus == [0, 2]
    assert AimdConfig.from_settings(Settings()) == AimdConfig()  # the two sets of defaults agree


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        AimdConfig(decrease_factor=1.2)
    with pytest.raises(ValueError):
        AimdConfig(kv_usage_resume=0.99, kv_usage_high=0.9)
    with pytest.raises(ValueError):
        AimdConfig(limit_min=10, limit_max=5)


class Scripted:
    """A limit algorithm that sets the limits it is given, one per tick, and keeps what it was shown."""

    def __init__(self, limits: list[int]) -> None:
        self._limits = limits
        self._limit = limits[0]
        self.seen: list[Observation] = []

    @property
    def limit(self) -> int:
        return self._limit

    def step(self, observation: Observation) -> Decision:
        self.seen.append(observation)
        previous = self._limit
        self._limit = self._limits[min(len(self.seen), len(self._limits) - 1)]
        action = (
            Action.INCREASE if self._limit > previous else Action.DECREASE if self._limit < previous else Action.HOLD
        )
        return Decision(observation.now, self._limit, previous, action, Reason.PROBE, None)

    def state(self) -> dict:
        return {}


def test_a_steps_burst_is_left_out_of_the_ttft_evidence_only() -> None:
    """The requests a step up admits at once prefill behind each other: their slow first tokens are the
    step's doing, so only requests admitted once it settled are judged on TTFT. Their decoding ran at the new
    limit, so it counts towards TPOT."""
    config = AimdConfig(settle_s=2.0)
    algorithm = Scripted([5, 5, 10])  # the second tick (t=4) raises the limit from 5 to 10
    control = UpstreamControl("u", config, initial_limit=5, algorithm=algorithm)
    window = SlidingWindow(30.0)
    for now in (2.0, 4.0):
        control.tick(now, window, LimiterState(algorithm.limit, 5, 5, 3))
    for i in range(5):  # the step's burst, admitted right after it
        window.add(sample(4.1 + 0.2 * i, ttft=3.0, dur=4.0))
    control.tick(12.0, window, LimiterState(10, 10, 10, 3))
    seen = algorithm.seen[-1]
    assert seen.ttft_samples == 0 and seen.ttft_p99 is None
    assert seen.latency_samples == 5 and seen.tpot_p99 == pytest.approx(0.01)  # (4 s - 3 s) / 100 tokens
    for i in range(5):  # admitted once the step settled, as slow: this limit's own latency
        window.add(sample(7.0 + 0.2 * i, ttft=3.0, dur=4.0))
    control.tick(14.0, window, LimiterState(10, 10, 10, 3))
    seen = algorithm.seen[-1]
    assert seen.ttft_samples == 5 and seen.ttft_p99 == pytest.approx(3.0) and seen.latency_samples == 10


def test_a_bursts_long_answers_stay_out_of_the_ttft_evidence_after_the_window_passed_its_admission() -> None:
    """The window holds requests by when they finished, so a burst's requests with answers longer than the
    window's horizon arrive in it after the burst itself is older than the horizon: they are still the
    burst's (the 70B long-prompt deployment's ``ttft_slo`` cuts were its first tokens, seconds late)."""
    algorithm = Scripted([5, 5, 10])  # the second tick (t=4) raises the limit from 5 to 10
    control = UpstreamControl("u", AimdConfig(settle_s=2.0), initial_limit=5, algorithm=algorithm)
    window = SlidingWindow(10.0)
    for now in (2.0, 4.0):
        control.tick(now, window, LimiterState(algorithm.limit, 5, 5, 3))
    for now in range(6, 26, 2):  # nothing finished yet: the window is empty
        control.tick(float(now), window, LimiterState(10, 10, 10, 3))
    for i in range(5):  # the step's burst, 20-second answers
        window.add(sample(4.1 + 0.2 * i, ttft=3.0, dur=20.0))
    window.add(sample(10.0, ttft=0.4, dur=15.0))  # admitted in steady state
    control.tick(26.0, window, LimiterState(10, 10, 10, 3))
    seen = algorithm.seen[-1]
    assert seen.ttft_samples == 1 and seen.ttft_p99 == pytest.approx(0.4) and seen.latency_samples == 6


def test_demand_that_fills_spare_slots_at_once_is_a_burst_too() -> None:
    """Clients arriving after an idle spell take every free slot at once: the same burst as a step's."""
    algorithm = Scripted([8])
    control = UpstreamControl("u", AimdConfig(settle_s=2.0), initial_limit=8, algorithm=algorithm)
    window = SlidingWindow(30.0)
    control.tick(2.0, window, LimiterState(8, 0, 0, 0))  # idle: slots to spare
    control.tick(4.0, window, LimiterState(8, 8, 8, 5))  # the clients came since
    for i in range(4):
        window.add(sample(2.5 + 0.5 * i, ttft=3.0, dur=4.0))  # admitted in the burst (2 s to 6 s)
    window.add(sample(7.0, ttft=0.5, dur=4.0))  # admitted in steady state
    control.tick(12.0, window, LimiterState(8, 8, 8, 5))
    seen = algorithm.seen[-1]
    assert seen.ttft_samples == 1 and seen.ttft_p99 == 0.5 and seen.latency_samples == 5


@pytest.mark.parametrize("cut_to,still_counted", [(19, True), (15, False)])
def test_latency_evidence_survives_a_small_decrease_only(cut_to: int, still_counted: bool) -> None:
    """The hard cap or the knee moving a slot down leaves the requests admitted before it as evidence: with
    answers that outlast the limit's stillness, restarting at every such move left the latency objectives
    never judged (the matrix's 70B reasoning deployment, 2x slower: 1-3-minute answers, a move every 20-60 s,
    the limit over the TPOT cliff unchecked). A real cut (a tenth or more) still restarts it."""
    algorithm = Scripted([20, 20, 20, cut_to])  # the third tick (t=6) moves the limit down
    control = UpstreamControl("u", AimdConfig(settle_s=2.0), initial_limit=20, algorithm=algorithm)
    window = SlidingWindow(30.0)
    for now in (2.0, 4.0, 6.0):  # busy from the start: the first clients' burst ends at 4 s
        control.tick(now, window, LimiterState(20, 20, 20, 5))
    for i in range(3):  # admitted before the move, at 20
        window.add(sample(4.5 + 0.2 * i, ttft=0.5, dur=6.0))
    control.tick(12.0, window, LimiterState(cut_to, cut_to, cut_to, 5))
    assert algorithm.seen[-1].latency_samples == (3 if still_counted else 0)
