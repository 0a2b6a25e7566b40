"""The demo's pure parts: the script and its scaling, each phase's reference, timeline rows read from
``/state`` documents of any shape, and the per-phase verdicts; for ``--elastic``, the capacity signal read from
the gateway's real exposition, every upstream's row, and the join found in the timeline."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from rich.console import Console

from gateway.demo.elastic import find_join, join_lines, pool_table, summarize_elastic, upstream_table
from gateway.demo.reference import backend_requests_per_s, reference_for, slowed_level
from gateway.demo.script import (
    DEFAULT,
    ELASTIC,
    QUICK,
    QUICK_ELASTIC,
    Script,
    arrival_rate,
    gateway_env,
    is_judged,
    scaled_slo,
)
from gateway.demo.summary import MISS, NO_DATA, NOT_JUDGED, PASS, overall, summarize
from gateway.demo.timeline import (
    Sample,
    SignalSample,
    UpstreamSample,
    build_sample,
    read_signal,
    signal_sample,
)
from gateway.demo.view import plain_line, signal_text, upstreams_text
from gateway.settings import Settings
from gateway.sweep.finder import find_sweet_spot, judge
from gateway.sweep.live import LiveStats
from gateway.sweep.loadgen import PoolStats
from gateway.sweep.result import SLO, LevelMetrics, ServerInfo, Stats, SweepResult, SweepSettings
from gateway.telemetry.metrics import GatewayMetrics

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


# --- the elastic variant (sweetspot demo --elastic) ---------------------------------------------------------


def test_elastic_script_is_open_loop_with_one_join_after_a_phase_long_enough_to_measure_capacity() -> None:
    for script in (ELASTIC, QUICK_ELASTIC):
        assert script.open_loop and script.elastic
        assert [p.join for p in script.phases] == [False, True]
        # more arrivals than one backend delivers at its sweet spot, in both phases: the queue grows before the join
        assert all(p.rate_x > 1 for p in script.phases)
        # the capacity counts after the limit bound for a whole window (window_s, scaled 2x): the phase before
        # the join outlasts it with room for the queue to build first
        window = Settings.model_fields["window_s"].default / 2.0
        assert script.phases[0].duration_s >= 2 * window
    assert not DEFAULT.open_loop and not DEFAULT.elastic and not QUICK.elastic
    assert QUICK_ELASTIC.sweep_levels == QUICK.sweep_levels and QUICK_ELASTIC.load_s < ELASTIC.load_s
    with pytest.raises(ValueError, match="all open loop"):
        Script(phases=(DEFAULT.phases[0], ELASTIC.phases[0]), sweep_levels=(8,), sweep_measure_s=1.0)


def test_arrival_rate_is_a_multiple_of_one_backends_requests_per_second() -> None:
    assert arrival_rate(ELASTIC.phases[0], 10.0) == pytest.approx(10.0 * ELASTIC.phases[0].rate_x)
    with pytest.raises(ValueError):
        arrival_rate(DEFAULT.phases[0], 10.0)  # closed loop
    with pytest.raises(ValueError):
        arrival_rate(ELASTIC.phases[0], 0.0)


def test_backend_requests_per_s_is_the_best_level_within_the_objectives() -> None:
    result = sweep()  # sweet spot 32; 48 is the peak of tokens/s
    rates = {8: 7.0, 16: 12.0, 24: 15.0, 32: 17.5, 48: 18.2}
    levels = [lv.model_copy(update={"requests_per_s": rates[lv.concurrency]}) for lv in result.levels]
    assert backend_requests_per_s(result.model_copy(update={"levels": levels})) == 18.2
    # a level over an objective does not count, however fast
    levels[-1] = levels[-1].model_copy(update={"slo_met": False, "requests_per_s": 30.0})
    assert backend_requests_per_s(result.model_copy(update={"levels": levels})) == 17.5
    missed = [lv.model_copy(update={"slo_met": False}) for lv in levels]
    assert backend_requests_per_s(result.model_copy(update={"levels": missed})) is None


def test_elastic_env_scales_discovery_and_the_scale_down_hold_too() -> None:
    plain, elastic = gateway_env(2.0), gateway_env(2.0, elastic=True)
    assert "SWEETSPOT_DISCOVERY_INTERVAL_S" not in plain  # the default demo's environment is unchanged
    assert set(elastic) - set(plain) == {"SWEETSPOT_DISCOVERY_INTERVAL_S", "SWEETSPOT_SCALE_DOWN_AFTER_S"}
    defaults = Settings.model_fields
    assert float(elastic["SWEETSPOT_DISCOVERY_INTERVAL_S"]) == defaults["discovery_interval_s"].default / 2
    settings = Settings(**{key.removeprefix("SWEETSPOT_").lower(): value for key, value in elastic.items()})
    assert settings.scale_down_after_s == defaults["scale_down_after_s"].default / 2


A, B = "http://127.0.0.1:1001", "http://127.0.0.1:1002"
LABELS = {A: "backend-1", B: "backend-2"}


def exposition(desired: int | None, serving: int, capacity: dict[str, float], model: str = "m") -> str:
    """The gateway's own /metrics text, from its real registry, with the capacity signal's gauges set."""
    metrics = GatewayMetrics()
    if desired is not None:
        metrics.upstreams_desired.labels(model).set(desired)
    metrics.upstreams_serving.labels(model).set(serving)
    metrics.demand_requests.labels(model).set(23.4)
    metrics.upstreams_serving.labels("other-model").set(7)
    for url, rps in capacity.items():
        metrics.upstream_capacity_requests.labels(url, model).set(rps)
        metrics.upstream_capacity_tokens.labels(url, model).set(rps * 128)
    if capacity:
        metrics.pool_capacity_requests.labels(model).set(sorted(capacity.values())[0])
    return generate_latest(metrics.registry).decode()


def test_read_signal_takes_the_models_gauges_and_leaves_absent_ones_out() -> None:
    found = read_signal(exposition(2, 1, {A: 18.0}), "m")
    assert found["sweetspot_upstreams_desired"] == {"": 2.0}
    assert found["sweetspot_upstreams_serving"] == {"": 1.0}  # not the other model's 7
    assert found["sweetspot_upstream_capacity_requests_per_second"] == {A: 18.0}
    assert "sweetspot_pool_capacity_tokens_per_second" not in found  # never set: absent, not 0
    unmeasured = signal_sample(read_signal(exposition(None, 1, {}), "m"))
    assert unmeasured.desired is None and unmeasured.pool_requests_per_s is None and unmeasured.serving == 1
    assert unmeasured.demand_requests_per_s == pytest.approx(23.4)
    assert read_signal(None, "m") == {} and read_signal("garbage{{{ 1", "m") == {}


def test_elastic_sample_lists_every_upstream_with_its_capacity() -> None:
    state = {
        "queue": {"depth": 5},
        "upstreams": [
            {"url": A, "limit": 30, "inflight": 30, "window": WINDOW, "controller": {"limit": 32}},
            {"url": B, "limit": 30, "inflight": 3, "healthy": True, "retiring": False},
            {"url": 7},
        ],
    }
    s = build_sample(
        3.0,
        1,
        state,
        None,
        LIVE,
        POOL,
        arrivals_per_s=22.5,
        labels=LABELS,
        metrics=exposition(2, 2, {A: 18.0}),
        model="m",
    )
    assert s.arrivals_per_s == 22.5 and s.signal is not None and (s.signal.desired, s.signal.serving) == (2, 2)
    one, two = s.upstreams
    assert (one.label, one.limit, one.inflight, one.tokens_per_s, one.capacity_requests_per_s) == (
        "backend-1",
        32,
        30,
        2100.0,
        18.0,
    )
    assert (two.label, two.limit, two.capacity_requests_per_s, two.healthy, two.retiring) == (
        "backend-2",
        30,
        None,
        True,
        False,
    )
    # the default demo reads none of it
    plain = build_sample(3.0, 1, state, None, LIVE, POOL)
    assert plain.upstreams == () and plain.signal is None and plain.arrivals_per_s is None
    text = plain_line(s, "second joins") + "\n" + upstreams_text(s) + "\n" + signal_text(s)
    assert "arrivals  22.5/s" in text and "backend-2 limit 30 in-flight 3" in text and "desired 2, serving 2" in text
    assert "capacity 18.0 req/s" in text


def elastic_row(t: float, phase: int, ups: list[tuple[str, int, int]], *, queued: int, tps: float, desired: int | None):
    upstreams = tuple(
        UpstreamSample(
            label=label,
            url={"backend-1": A, "backend-2": B}[label],
            healthy=True,
            retiring=False,
            limit=limit,
            inflight=inflight,
            tokens_per_s=tps / len(ups),
            capacity_requests_per_s=18.0 if label == "backend-1" and desired else None,
            capacity_tokens_per_s=None,
        )
        for label, limit, inflight in ups
    )
    signal = SignalSample(desired, len(ups), 23.0, 18.0 if desired else None, None)
    return replace(
        row(t, phase, ups[0][1], queued=queued, tokens_per_s=tps, client_ttft_p99_ms=100.0 * (1 + queued)),
        arrivals_per_s=23.0,
        upstreams=upstreams,
        signal=signal,
    )


def test_elastic_summary_finds_the_join_its_start_limit_and_the_pool_before_and_after() -> None:
    phases = ELASTIC.phases
    samples = [
        elastic_row(t, 0, [("backend-1", 32, 32)], queued=5 * t, tps=2200, desired=2 if t > 5 else None)
        for t in range(10)
    ]
    samples.append(elastic_row(10, 1, [("backend-1", 30, 30)], queued=50, tps=2200, desired=2))  # written at 10.0
    samples.append(elastic_row(11, 1, [("backend-1", 30, 30)], queued=48, tps=2300, desired=2))
    samples += [
        elastic_row(12 + t, 1, [("backend-1", 30, 15), ("backend-2", 30, 15)], queued=0, tps=2900, desired=2)
        for t in range(10)
    ]
    summary = summarize_elastic(phases, samples, [23.0, 23.0], {1: ("backend-2", B)}, {1: 10.0})
    (join,) = summary.joins
    assert (join.label, join.joined_at_s, join.start_limit, join.sibling_limit) == ("backend-2", 12, 30, 30)
    assert join.delay_s == pytest.approx(2.0)
    assert join.before is not None and join.after is not None
    assert (join.before.serving, join.before.desired, join.after.serving, join.after.desired) == (1, 2, 2, 2)
    assert join.before.queued_median > 0 and join.after.queued_median == 0
    assert join.after.tokens_per_s_median == 2900 and join.before.tokens_per_s_median == 2200
    assert [(u.phase, u.label) for u in summary.upstreams] == [
        ("one backend", "backend-1"),
        ("second joins", "backend-1"),
        ("second joins", "backend-2"),
    ]
    assert summary.upstreams[0].capacity_requests_per_s == 18.0 and summary.upstreams[2].capacity_requests_per_s is None
    lines = join_lines(summary, "upstreams.txt", 2.5)
    assert lines[0].startswith("backend-2 joined at 12.0 s, 2.0 s after the demo listed it in upstreams.txt")
    assert "started at limit 30, its siblings' median limit then (30)" in lines[0]
    assert "desired 2 for 1 serving" in lines[1] and "desired 2 for 2 serving" in lines[2] and "1.32x" in lines[2]
    assert lines[-1] == "result: backend-2 joined the running gateway; no client request failed"
    document = summary.as_dict()
    assert document["joins"][0]["delay_s"] == 2.0 and document["pool"][1]["steady"]["serving"] == 2
    console = Console(width=140, record=True)
    console.print(pool_table(summary))
    console.print(upstream_table(summary))
    text = console.export_text()
    assert "second joins" in text and "backend-2" in text and "18.0" in text


def test_an_upstream_that_never_appears_is_reported_not_invented() -> None:
    samples = [elastic_row(t, 0, [("backend-1", 32, 32)], queued=1, tps=2000, desired=2) for t in range(5)]
    samples += [elastic_row(5 + t, 1, [("backend-1", 32, 32)], queued=9, tps=2000, desired=2) for t in range(5)]
    summary = summarize_elastic(ELASTIC.phases, samples, [23.0, 23.0], {1: ("backend-2", B)}, {1: 5.0})
    (join,) = summary.joins
    assert join.joined_at_s is None and join.start_limit is None and join.delay_s is None
    lines = join_lines(summary, "upstreams.txt", None)
    assert "never appeared" in lines[0] and lines[-1] == "result: an upstream listed in the file did not join"
    # an upstream present before the file listed it (configured from the start) is not a join
    assert find_join(samples, "backend-1", 5.0) == (5, 32, None)
