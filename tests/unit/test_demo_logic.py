"""The demo's pure parts: the script and its scaling, each phase's reference, timeline rows read from
``/state`` documents of any shape, and the per-phase verdicts."""

from __future__ import annotations

import pytest

from gateway.demo.reference import reference_for, slowed_level
from gateway.demo.script import DEFAULT, QUICK, gateway_env, is_judged, scaled_slo
from gateway.demo.summary import MISS, NO_DATA, NOT_JUDGED, PASS, overall, summarize
from gateway.demo.timeline import Sample, build_sample
from gateway.settings import Settings
from gateway.sweep.finder import find_sweet_spot, judge
from gateway.sweep.live import LiveStats
from gateway.sweep.loadgen import PoolStats
from gateway.sweep.result import SLO, LevelMetrics, ServerInfo, Stats, SweepResult, SweepSettings

# tokens/s, p99 TTFT ms, p99 TPOT ms, shaped like the default profile at 2x (sweet spot 32 at 90%)
CURVE = {8: (1070, 30, 8), 16: (1740, 47, 9), 24: (2100, 57, 12), 32: (2190, 59, 15), 48: (2350, 97, 20)}


def sweep(slo: SLO = SLO(ttft_ms=1000, tpot_ms=50), curve: dict = CURVE) -> SweepResult:
    levels = [
        judge(
            LevelMetrics(
                concurrency=c,
                output_tokens_per_s=tps,
                completed=50,
                requests=50,
                ttft_ms=Stats(count=50, p50=ttft / 2, p99=ttft),
                tpot_ms=Stats(count=50, p50=tpot / 2, p99=tpot),
            ),
            slo,
        )
        for c, (tps, ttft, tpot) in curve.items()
    ]
    verdict = find_sweet_spot(levels, slo=slo)
    return SweepResult(
        server=ServerInfo(url="http://sim", api="chat", model="m"),
        settings=SweepSettings(levels=list(curve), slo=slo),
        levels=levels,
        peak_tokens_per_s=verdict.peak_tokens_per_s,
        peak_concurrency=verdict.peak_concurrency,
        sweet_spot=verdict.sweet_spot,
        cliff=verdict.cliff,
        verdict=verdict.reason,
    )


def test_reference_at_normal_speed_is_the_sweeps_sweet_spot() -> None:
    ref = reference_for(sweep(), 1.0)
    assert ref.concurrency == 32 and ref.tokens_per_s == 2190
    assert "sweep's sweet spot" in ref.source


def test_slowed_backend_keeps_the_concurrency_while_the_slos_hold() -> None:
    ref = reference_for(sweep(), 2.0)  # latencies double: p99 TPOT 30 ms at 32, still under 50 ms
    assert ref.concurrency == 32
    assert ref.tokens_per_s == pytest.approx(2190 / 2)


def test_slowed_backend_moves_the_reference_when_an_slo_breaks() -> None:
    # p99 TPOT 15 ms at 32 becomes 45 ms at 3x; with a 40 ms objective 32 and 48 fail, so within the
    # SLOs nothing reaches 90% of the peak: no reference, and the reason says so
    ref = reference_for(sweep(slo=SLO(ttft_ms=1000, tpot_ms=40)), 3.0)
    assert ref.concurrency is None and "no sweet spot" in ref.source


def test_slowed_level_scales_throughput_down_and_latency_up() -> None:
    level = sweep().levels[0]
    slow = slowed_level(level, 2.0)
    assert slow.output_tokens_per_s == pytest.approx(level.output_tokens_per_s / 2)
    assert slow.tpot_ms.p99 == pytest.approx(level.tpot_ms.p99 * 2)
    assert slow.ttft_ms.p50 == pytest.approx(level.ttft_ms.p50 * 2)
    assert slow.concurrency == level.concurrency


def test_scaled_slo_and_gateway_env_follow_the_time_scale() -> None:
    assert scaled_slo(2.0) == SLO(ttft_ms=1000.0, tpot_ms=50.0)
    env = gateway_env(2.0)
    defaults = Settings.model_fields
    assert float(env["SWEETSPOT_CONTROL_INTERVAL_S"]) == pytest.approx(defaults["control_interval_s"].default / 2)
    assert float(env["SWEETSPOT_WINDOW_S"]) == pytest.approx(defaults["window_s"].default / 2)
    # the gateway reads these names: every one is a real setting
    assert all(key.removeprefix("SWEETSPOT_").lower() in defaults for key in env)
    settings = Settings(**{key.removeprefix("SWEETSPOT_").lower(): value for key, value in env.items()})
    assert settings.window_s == pytest.approx(defaults["window_s"].default / 2)


def test_quick_script_is_the_default_shortened() -> None:
    assert [p.name for p in QUICK.phases] == [p.name for p in DEFAULT.phases]
    assert [p.clients for p in QUICK.phases] == [p.clients for p in DEFAULT.phases]
    assert QUICK.load_s == pytest.approx(DEFAULT.load_s * 0.2)
    assert DEFAULT.scaled(0.5).load_s == pytest.approx(DEFAULT.load_s / 2)
    with pytest.raises(ValueError):
        DEFAULT.scaled(0)


def test_a_phase_is_judged_only_when_demand_exceeds_the_sweet_spot() -> None:
    assert is_judged(64, 32) and not is_judged(4, 32) and not is_judged(16, 16) and not is_judged(64, None)
    assert is_judged(40, 32) and not is_judged(39, 32)


LIVE = LiveStats(
    horizon_s=4,
    chunks_per_s=1234.5,
    requests_per_s=9,
    ttft_p99_ms=None,
    tpot_p99_ms=None,
    ok=3,
    failed=0,
    rejected=0,
    in_flight=30,
    waiting=0,
)
POOL = PoolStats(
    concurrency=64,
    in_flight=64,
    waiting=0,
    started=100,
    completed=36,
    ok=35,
    failed=1,
    rejected=0,
    chunks=5000,
    output_tokens=4000,
)
WINDOW = {"output_tokens_per_s": 2100.0, "upstream_ttft_p99": 0.06, "ttft_p99": 3.2, "tpot_p99": 0.015}


def test_sample_without_a_controller_reads_the_static_limit() -> None:
    state = {"queue": {"depth": 34}, "upstreams": [{"limit": 30, "inflight": 30, "window": WINDOW}]}
    backend = {"num_running": 30, "num_waiting": 0, "kv_usage": 0.41, "num_preemptions": 0}
    s = build_sample(12.3456, 1, state, backend, LIVE, POOL)
    assert (s.t, s.phase, s.clients, s.limit, s.inflight, s.queued) == (12.346, 1, 64, 30, 30, 34)
    assert s.tokens_per_s == 1234.5 and s.gateway_tokens_per_s == 2100.0
    assert s.ttft_p99_ms == pytest.approx(60) and s.client_ttft_p99_ms == pytest.approx(3200)
    assert s.tpot_p99_ms == pytest.approx(15)
    assert (s.backend_running, s.kv_usage, s.preemptions, s.ok, s.failed) == (30, 0.41, 0, 35, 1)
    assert s.action is None and s.reason is None


def test_sample_reads_the_controller_when_there_is_one() -> None:
    controller = {
        "limit": 28,
        "last_decision": {"action": "hold", "reason": "steady", "limit": 28},
        "decisions": [
            {"action": "decrease", "reason": "knee", "previous": 32, "limit": 24},
            {"action": "increase", "reason": "probe", "previous": 24, "limit": 28},
            {"action": "hold", "reason": "steady", "previous": 28, "limit": 28},
        ],
    }
    state = {
        "queue": {"depth": 0},
        "upstreams": [{"limit": 28, "inflight": 20, "window": WINDOW, "controller": controller}],
    }
    s = build_sample(1.0, 0, state, None, LIVE, POOL)
    assert (s.limit, s.action, s.reason) == (28, "hold", "steady")
    assert s.last_move == "increase 24->28 (probe)"
    assert s.backend_running is None and s.kv_usage is None


@pytest.mark.parametrize(
    "state",
    [
        None,
        {},
        {"upstreams": []},
        {"upstreams": ["x"]},
        {"queue": 5, "upstreams": [{}]},
        {"upstreams": [{"limit": "many", "window": None, "controller": 3}]},
    ],
)
def test_sample_survives_any_state_shape(state: object) -> None:
    s = build_sample(1.0, 0, state, {"kv_usage": True}, LIVE, POOL)
    assert s.limit is None and s.queued is None and s.action is None and s.kv_usage is None
    assert s.last_move is None


def row(t: float, phase: int, limit: int | None, clients: int = 64, **kw: object) -> Sample:
    base = dict(
        inflight=limit,
        queued=0,
        tokens_per_s=1000.0,
        gateway_tokens_per_s=None,
        ttft_p99_ms=None,
        client_ttft_p99_ms=None,
        tpot_p99_ms=10.0,
        backend_running=None,
        backend_waiting=None,
        kv_usage=0.5,
        preemptions=0,
        ok=0,
        failed=0,
        rejected=0,
    )
    base.update(kw)
    return Sample(t=t, phase=phase, clients=clients, limit=limit, **base)  # type: ignore[arg-type]


def test_summary_judges_the_steady_part_of_demanding_phases_only() -> None:
    phases = DEFAULT.phases[:3]  # light (4 clients), surge (64), slow backend (64)
    refs = [reference_for(sweep(), p.speed_factor) for p in phases]
    samples = [row(t, 0, 32, clients=4, inflight=4) for t in range(0, 10)]
    # surge (t 10..24): the first 30% (to t 14.2) is the transition and not counted; then 20, 22, 30..34
    samples += [row(10 + t, 1, v) for t, v in enumerate([10, 12, 14, 16, 18, 20, 22, 30, 31, 32, 33, 34, 32, 31, 30])]
    # slow backend: the limit collapses to 12 and stays there
    samples += [row(25 + t, 2, 12, preemptions=t, failed=t // 5) for t in range(10)]
    light, surge, slow = summarize(phases, samples, refs)
    assert light.verdict == NOT_JUDGED and not light.judged and "in-flight median 4" in light.note
    assert surge.judged and surge.verdict == PASS
    assert (surge.steady_from_s, surge.samples, surge.limit_min, surge.limit_max) == (14.2, 10, 20, 34)
    assert surge.ratio == pytest.approx(surge.limit_median / 32, abs=1e-3)
    assert slow.verdict == MISS and slow.ratio == pytest.approx(12 / 32, abs=1e-3) and slow.in_band == 0
    assert slow.preemptions == 9 and slow.failed == 1
    assert overall([light, surge]) is True and overall([light, surge, slow]) is False
    assert overall([light]) is None


def test_summary_stops_at_the_last_phase_reached_and_flags_missing_limits() -> None:
    phases = DEFAULT.phases
    refs = [reference_for(sweep(), p.speed_factor) for p in phases]
    samples = [row(t, 0, None, clients=4) for t in range(5)]
    summaries = summarize(phases, samples, refs)
    assert len(summaries) == 1 and summaries[0].verdict == NO_DATA


def test_an_unjudged_phase_says_when_the_limit_throttled_a_demand_under_the_sweet_spot() -> None:
    phases = DEFAULT.phases[-1:]  # calm: 16 clients
    refs = [reference_for(sweep(), 1.0)]
    samples = [row(t, 0, 13, clients=16, inflight=13, queued=3) for t in range(10)]
    (calm,) = summarize(phases, samples, refs)
    assert calm.verdict == NOT_JUDGED
    assert "sat below the demand" in calm.note and "3 requests queued" in calm.note
