"""The rolling client-side view a live display reads (chunk rate, completions, p99 latencies)."""

from __future__ import annotations

import pytest

from gateway.sweep.client import RequestRecord
from gateway.sweep.live import LiveWindow
from gateway.sweep.loadgen import PoolStats


def stats(chunks: int, in_flight: int = 3) -> PoolStats:
    return PoolStats(
        concurrency=4,
        in_flight=in_flight,
        waiting=1,
        started=0,
        completed=0,
        ok=0,
        failed=0,
        rejected=0,
        chunks=chunks,
        output_tokens=0,
    )


def done(start: float, ttft: float, end: float, tokens: int, status: int = 200) -> RequestRecord:
    ok = status == 200
    chunks = [start + ttft + (end - start - ttft) * i / max(tokens - 1, 1) for i in range(tokens)] if ok else []
    return RequestRecord(
        index=0,
        prompt_len=1,
        max_tokens=tokens,
        start=start,
        status=status,
        ok=ok,
        chunk_times=chunks,
        end=end,
        output_tokens=tokens if ok else 0,
        usage_reported=ok,
    )


def test_rates_and_percentiles_over_the_horizon() -> None:
    window = LiveWindow(horizon_s=10.0)
    window.observe(0.0, stats(0))
    window.add(done(0.0, 0.5, 2.5, 21))  # TTFT 500 ms, TPOT 100 ms
    window.add(done(1.0, 1.0, 3.0, 11))  # TTFT 1000 ms, TPOT 100 ms
    window.add(done(2.0, 0.0, 2.1, 1, status=429))
    window.observe(4.0, stats(400))
    live = window.snapshot(4.0)
    assert live.chunks_per_s == pytest.approx(100.0)
    assert live.ok == 2 and live.rejected == 1 and live.failed == 0
    assert live.requests_per_s == pytest.approx(2 / 4.0)  # only 4 s observed so far
    assert live.ttft_p99_ms == pytest.approx(995.0)
    assert live.tpot_p99_ms == pytest.approx(100.0)
    assert (live.in_flight, live.waiting) == (3, 1)


def test_old_requests_and_counts_leave_the_window() -> None:
    window = LiveWindow(horizon_s=5.0)
    window.observe(0.0, stats(0))
    window.add(done(0.0, 0.5, 1.0, 2))
    for t in range(1, 21):
        window.observe(float(t), stats(50 * t))
    live = window.snapshot(20.0)
    assert live.ok == 0 and live.ttft_p99_ms is None and live.requests_per_s == 0.0
    assert live.chunks_per_s == pytest.approx(50.0)
