"""The sliding window: per-request derived times and windowed statistics."""

from __future__ import annotations

import pytest

from gateway.control.window import Outcome, RequestSample, SlidingWindow, percentile


def sample(
    arrived: float,
    *,
    wait: float = 0.0,
    ttft: float = 0.5,
    dur: float = 5.0,
    out: int = 101,
    outcome: Outcome = Outcome.OK,
) -> RequestSample:
    admitted = arrived + wait
    return RequestSample(
        arrived=arrived,
        admitted=admitted,
        finished=admitted + dur,
        first_token=admitted + ttft,
        prompt_tokens=10,
        output_tokens=out,
        outcome=outcome,
    )


def test_sample_derived_times_follow_vllm_definitions() -> None:
    s = sample(10.0, wait=2.0, ttft=0.5, dur=5.5, out=101)
    assert s.queue_wait == 2.0
    assert s.ttft == pytest.approx(2.5)  # client-seen, queue included
    assert s.upstream_ttft == pytest.approx(0.5)  # net of the queue
    assert s.tpot == pytest.approx((5.5 - 0.5) / 100)
    assert s.e2e == pytest.approx(7.5)
    assert sample(0, out=1).tpot is None


def test_percentile_matches_numpy_linear() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_tokens_per_second_counts_streamed_tokens_in_the_horizon() -> None:
    window = SlidingWindow(10.0)
    window.start(0.0)
    for t in range(30):
        window.add_tokens(t + 0.5, 100)  # 100 tokens/s for 30 s
    stats = window.stats(30.0)
    assert stats.output_tokens_per_s == pytest.approx(100.0, rel=0.01)
    assert stats.span_s == pytest.approx(10.0)


def test_early_window_divides_by_the_time_it_has_seen() -> None:
    window = SlidingWindow(10.0)
    window.start(0.0)
    window.add_tokens(1.5, 200)
    assert window.stats(2.0).output_tokens_per_s == pytest.approx(100.0)


def test_outcomes_are_counted_and_latency_uses_successes_only() -> None:
    window = SlidingWindow(60.0)
    window.add(sample(0.0, ttft=0.1))
    window.add(sample(1.0, ttft=0.3))
    window.add(sample(2.0, ttft=9.0, outcome=Outcome.UPSTREAM_ERROR))
    window.add(sample(3.0, outcome=Outcome.TIMED_OUT))
    window.add(sample(4.0, outcome=Outcome.CLIENT_CANCELLED))
    stats = window.stats(20.0)
    assert (stats.completed, stats.ok, stats.upstream_errors, stats.timeouts, stats.cancelled) == (5, 2, 1, 1, 1)
    assert stats.upstream_ttft_p99 == pytest.approx(0.298, abs=1e-3)


def test_old_samples_fall_out_of_the_window() -> None:
    window = SlidingWindow(10.0)
    window.add(sample(0.0, dur=1.0))
    window.add(sample(20.0, dur=1.0))
    assert window.stats(25.0).completed == 1


def test_samples_and_token_buckets_are_pruned_as_they_are_added() -> None:
    """Nothing need read the window (a gateway without its controller) for its memory to stay flat."""
    window = SlidingWindow(10.0)
    for second in range(5000):
        now = float(second)
        window.add_tokens(now, 5)
        window.add(
            RequestSample(
                arrived=now - 1,
                admitted=now - 1,
                finished=now,
                first_token=None,
                prompt_tokens=1,
                output_tokens=5,
                outcome=Outcome.OK,
                streamed=False,
            )
        )
    assert len(window._samples) <= 11 and len(window._token_buckets) <= 12
