"""Metering throughput when answers are not streamed: the window's record of whole answers, the meter's
pending readings, the choice between the gateway's count and the backend's counter, and the request
tracker that feeds them."""

from __future__ import annotations

import pytest

from gateway.control.accounting import MIXED_HOLD_S, TokenAccounting, share
from gateway.control.config import AimdConfig
from gateway.control.knee_search.meter import PENDING_MAX_S, Readings, ThroughputMeter
from gateway.control.observation import Headroom, LimiterState, observe
from gateway.control.window import Outcome, RequestSample, SlidingWindow, Span
from gateway.server.admission.limiter import Limiter
from gateway.server.relay.measure import RequestTracker
from gateway.server.upstream.pool import Upstream
from gateway.telemetry.backends import llama_snapshot, vllm_snapshot
from gateway.telemetry.metrics import GatewayMetrics


def whole(admitted: float, finished: float, tokens: int) -> RequestSample:
    return RequestSample(
        arrived=admitted,
        admitted=admitted,
        finished=finished,
        first_token=None,
        prompt_tokens=10,
        output_tokens=tokens,
        outcome=Outcome.OK,
        streamed=False,
    )


def test_a_span_spreads_its_tokens_evenly_over_its_life() -> None:
    span = Span(10.0, 20.0, 100)
    assert span.tokens_in(0.0, 100.0) == 100
    assert span.tokens_in(15.0, 17.0) == pytest.approx(20.0)
    assert span.tokens_in(18.0, 30.0) == pytest.approx(20.0)
    assert span.tokens_in(20.5, 30.0) == 0.0
    assert Span(5.0, 5.0, 7).tokens_in(4.0, 6.0) == 7.0


def test_the_window_keeps_whole_answers_apart_from_streamed_tokens() -> None:
    window = SlidingWindow(10.0)
    window.add_tokens(1.0, 50)
    key = window.opened(2.0)
    later = window.opened(3.0)
    assert window.pending_since == 2.0
    window.closed(key)
    assert window.pending_since == 3.0
    window.closed(later)
    assert window.pending_since is None
    window.add(whole(2.0, 6.0, 400))
    # the window's own rate sees the answer at its end; the streamed count never sees it
    assert window.tokens_total == 450 and window.streamed_total == 50
    assert window.unstreamed_at == 6.0
    seen, spans = window.spans_after(0)
    assert seen == 1 and spans == [Span(2.0, 6.0, 400)]
    assert window.spans_after(seen) == (1, [])
    window.add(RequestSample(0.0, 0.0, 7.0, 0.5, 10, 30, Outcome.OK))  # streamed: its tokens came as they went
    assert window.tokens_total == 450 and window.spans_after(seen) == (1, [])


def test_a_reading_with_whole_answers_is_final_once_they_ended_and_spreads_them() -> None:
    """Requests of 100 tokens lasting 10 s, one admitted every second: 100 tokens/s. Counted when they end,
    a 3-s reading holds 3 of them or 4 depending on where it falls; spread over their lives, every reading
    says 100, once every request that ran in it has ended."""
    meter = ThroughputMeter()
    for t in range(0, 60):
        now = float(t)
        # the request admitted 10 s ago ends now; the oldest one still running was admitted 9 s ago
        meter.record(now, 0.0, 0.0, 10.0, spans=(Span(now - 10, now, 100),), pending_since=now - 9)
        if t >= 23:
            assert not meter.final(now - 3)  # requests that ran in [now-6, now-3] still run
            assert meter.final(now - 10)
            measured = meter.measure(now - 13, now - 10)
            assert measured is not None and measured[0] == pytest.approx(100.0)
            lumps = sum(1 for end in range(t - 13, t - 10 + 1) if end >= now - 13) * 100 / 3
            assert lumps != pytest.approx(100.0)  # what counting answers at their end would have said


def test_readings_hold_pending_until_the_requests_end_then_count_them() -> None:
    readings = Readings(settle_s=1.0, measure_s=2.0)
    config = AimdConfig()
    window = SlidingWindow(10.0)
    accounting = TokenAccounting(config.metrics_stale_s)
    control_limit = 4
    rates: list[tuple[float, float, float]] = []
    steady: list[float] = []
    # four slots, each a 4-s whole answer of 40 tokens, admitted in a staggered rhythm: 40 tokens/s
    keys: dict[int, int] = {}
    for tick in range(0, 81):
        now = tick * 0.5
        for slot in range(control_limit):
            start = slot + 4.0 * int((now - slot) // 4.0) if now >= slot else None
            if start is None:
                continue
            if now == start:
                if start >= 4.0:
                    window.closed(keys[slot])
                    window.add(whole(start - 4.0, start, 40))
                keys[slot] = window.opened(start)
        count = accounting.count(now, window, Headroom(), inflight=control_limit)
        if now < 4.0:
            continue  # every slot busy from here on; the meter starts now, as after a limit change
        obs = observe(now, window.stats(now), LimiterState(control_limit, control_limit, control_limit, 3), count=count)
        readings.observe(obs, control_limit, True)
        if readings.steady_since is not None:
            steady.append(now)
        rate = readings.take(now)
        if rate is not None:
            rates.append((now, readings.started, rate))
    assert steady[0] == 5.0  # settled as with streams
    assert len(rates) >= 5, rates
    for now, started, rate in rates:
        assert now >= started + 2.0 + 3.0  # it waited for the requests that ran in it to end
        assert rate == pytest.approx(40.0)


def test_a_stuck_request_delays_a_reading_only_so_long() -> None:
    meter = ThroughputMeter()
    readings = Readings(settle_s=0.0, measure_s=2.0)
    readings.meter = meter
    window = SlidingWindow(10.0)
    window.opened(0.0)  # never ends
    accounting = TokenAccounting(10.0)
    taken = None
    for tick in range(0, int(PENDING_MAX_S) + 20):
        now = float(tick)
        window.add_tokens(now, 10)
        obs = observe(
            now, window.stats(now), LimiterState(4, 4, 4, 1), count=accounting.count(now, window, Headroom(), 4)
        )
        readings.observe(obs, 4, True)
        if readings.take(now) is not None:
            taken = now
            break
    assert taken is not None and PENDING_MAX_S <= taken <= PENDING_MAX_S + 10


def live(total: float, at: float, running: int = 10, waiting: int = 0) -> Headroom:
    return Headroom(
        generation_tokens_total=total,
        generation_tokens_live=True,
        backend_running=running,
        backend_waiting=waiting,
        backend_at=at,
    )


def test_streams_are_counted_by_the_gateway_itself() -> None:
    window = SlidingWindow(10.0)
    accounting = TokenAccounting(10.0)
    window.add_tokens(1.0, 30)
    accounting.count(1.0, window, live(0.0, 1.0), 10)
    count = accounting.count(2.0, window, live(500.0, 2.0), 10)
    assert (count.source, count.total, count.at) == ("gateway", 30.0, 2.0)


def test_whole_answers_are_counted_by_the_backends_live_counter_our_share_of_it() -> None:
    window = SlidingWindow(10.0)
    accounting = TokenAccounting(10.0)
    window.opened(0.5)
    first = accounting.count(1.0, window, live(1000.0, 0.8), 10)
    assert (first.source, first.total) == ("backend", 0.0)  # counted from the first scrape on
    count = accounting.count(2.0, window, live(1600.0, 1.8, running=20, waiting=5), 10)
    assert (count.source, count.at) == ("backend", 1.8)
    assert count.total == pytest.approx(600 * 10 / 25)  # ours: 10 of the 25 it runs or queues
    again = accounting.count(2.5, window, live(1600.0, 1.8, running=20, waiting=5), 10)
    assert again.total == count.total  # the same scrape is counted once
    reset = accounting.count(3.0, window, live(100.0, 2.8), 10)
    assert reset.total == count.total  # a restarted backend's counter starts over from its new value


def test_without_a_fresh_live_counter_whole_answers_are_spread_by_the_gateway() -> None:
    llama = llama_snapshot({"llamacpp:tokens_predicted_total": [({}, 500.0)]}, 1.0)
    vllm = vllm_snapshot({"vllm:generation_tokens_total": [({}, 500.0)]}, 1.0)
    assert not llama.generation_tokens_live and vllm.generation_tokens_live
    window = SlidingWindow(10.0)
    window.add(whole(0.0, 1.0, 40))
    accounting = TokenAccounting(10.0)
    ends_only = Headroom(generation_tokens_total=500.0, generation_tokens_live=False, backend_at=1.0)
    count = accounting.count(1.5, window, ends_only, 4)
    assert count.source == "gateway" and count.spans == (Span(0.0, 1.0, 40),)
    accounting.count(2.0, window, live(600.0, 2.0), 4)
    assert accounting.count(3.0, window, live(700.0, 3.0), 4).source == "backend"
    assert accounting.count(20.0, window, live(900.0, 5.0), 4).source == "gateway"  # the counter went stale
    fresh = accounting.count(1.0 + MIXED_HOLD_S + 1, window, live(990.0, MIXED_HOLD_S + 1.5), 4)
    assert fresh.source == "gateway"  # no whole answer for a while: the streams are all there is


def test_the_share_of_a_backend() -> None:
    assert share(5, Headroom(backend_running=None)) == 1.0
    assert share(5, Headroom(backend_running=4, backend_waiting=0)) == 1.0  # ours in transit
    assert share(0, Headroom(backend_running=0)) == 0.0
    assert share(3, Headroom(backend_running=10, backend_waiting=2)) == pytest.approx(0.25)


def test_the_tracker_registers_a_whole_answer_while_it_runs_and_credits_it_once() -> None:
    window = SlidingWindow(10.0)
    upstream = Upstream("http://a", Limiter("http://a", 4), window)
    other = Upstream("http://b", Limiter("http://b", 4), SlidingWindow(10.0))
    clock = iter([5.0]).__next__
    tracker = RequestTracker(arrived=0.0, clock=clock)
    tracker.admit(upstream, 1.0, 1.0)
    tracker.switch(other)
    assert other.window.pending_since == 1.0
    tracker.switch(upstream)  # failed over before any answer
    assert other.window.pending_since is None and window.pending_since == 1.0
    tracker.usage({"prompt_tokens": 12, "completion_tokens": 64})
    sample = tracker.finish(Outcome.OK, GatewayMetrics())
    assert sample is not None and not sample.streamed and sample.first_token is None
    assert window.pending_since is None
    assert window.tokens_total == 64 and window.streamed_total == 0
    assert window.spans_after(0)[1] == [Span(1.0, 5.0, 64)]


def test_a_streamed_request_is_not_registered_and_keeps_its_correction() -> None:
    window = SlidingWindow(10.0)
    upstream = Upstream("http://a", Limiter("http://a", 4), window)
    tracker = RequestTracker(arrived=0.0, clock=lambda: 3.0, streamed=True)
    tracker.admit(upstream, 0.0, 0.0)
    tracker.switch(upstream)
    assert window.pending_since is None
    tracker.tokens(5, 1.0)
    tracker.usage({"completion_tokens": 7})
    tracker.finish(Outcome.OK, GatewayMetrics())
    assert window.streamed_total == 7 and window.spans_after(0)[1] == []
