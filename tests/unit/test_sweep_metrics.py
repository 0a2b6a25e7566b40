"""Metric definitions of the sweep (vLLM's), on hand-built request records with hand-checked numbers."""

from __future__ import annotations

import pytest

from gateway.sweep.client import RequestRecord
from gateway.sweep.result import SLO
from gateway.sweep.stats import level_metrics, meets_slo, summarize, tokens_in_window


def rec(
    start: float,
    chunks: list[float],
    *,
    tokens: int | None = None,
    end: float | None = None,
    status: int = 200,
    ok: bool = True,
    error: str | None = None,
) -> RequestRecord:
    """A finished request; ``tokens`` None means the server sent no usage (count content chunks)."""
    return RequestRecord(
        index=0,
        prompt_len=10,
        max_tokens=len(chunks),
        start=start,
        status=status,
        ok=ok,
        error=error,
        error_kind=None if ok else "http",
        chunk_times=list(chunks),
        end=end if end is not None else (chunks[-1] if chunks else start),
        output_tokens=tokens if tokens is not None else len(chunks),
        prompt_tokens=12 if tokens is not None else None,
        usage_reported=tokens is not None,
    )


# A: 4 chunks of one token; B: 3 chunks carrying 6 tokens, usage message 0.1 s after the last chunk.
A = rec(0.0, [0.5, 0.6, 0.7, 0.8], tokens=4)
B = rec(0.2, [1.2, 1.4, 1.6], tokens=6, end=1.7)


def test_per_request_definitions() -> None:
    assert A.ttft == pytest.approx(0.5)
    assert A.latency == pytest.approx(0.8)
    assert A.tpot == pytest.approx((0.8 - 0.5) / 3)
    assert A.itl == pytest.approx([0.1, 0.1, 0.1])
    assert B.ttft == pytest.approx(1.0)
    assert B.latency == pytest.approx(1.5)  # E2E runs to the usage message, as vLLM's chat client times it
    assert B.tpot == pytest.approx((1.7 - 1.2) / 5)  # TPOT uses reported tokens, not chunks
    assert B.itl == pytest.approx([0.2, 0.2])


def test_tpot_needs_two_tokens() -> None:
    one = rec(0.0, [0.3], tokens=1)
    assert one.tpot is None
    assert meets_slo(one, SLO(ttft_ms=500, tpot_ms=1)) is True  # TPOT counts as 0 for goodput, as in vLLM


def test_summarize_uses_numpy_linear_percentiles() -> None:
    stats = summarize([0.5, 1.0], 1000.0)
    assert stats.count == 2
    assert stats.mean == pytest.approx(750.0)
    assert stats.p50 == pytest.approx(750.0)
    assert stats.p90 == pytest.approx(950.0)
    assert stats.p99 == pytest.approx(995.0)
    assert summarize([]).p99 is None


def test_tokens_in_window_counts_arrivals_and_spreads_usage_over_chunks() -> None:
    assert tokens_in_window([A, B], 0.0, 2.0) == pytest.approx(10.0)
    # [0.6, 1.3): A's chunks at 0.6, 0.7, 0.8 (1 token each) and B's first chunk (2 tokens)
    assert tokens_in_window([A, B], 0.6, 1.3) == pytest.approx(5.0)
    assert tokens_in_window([A, B], 1.61, 5.0) == pytest.approx(0.0)


def test_level_metrics_by_hand() -> None:
    slo = SLO(ttft_ms=800, tpot_ms=150, e2e_ms=None)
    level = level_metrics([A, B], concurrency=2, window_start=0.0, window_end=2.0, slo=slo)
    assert level.requests == 2 and level.completed == 2 and level.failed == 0 and level.rejected == 0
    assert level.duration_s == pytest.approx(2.0)
    assert level.output_tokens == 10
    assert level.input_tokens == 24  # from usage.prompt_tokens
    assert level.output_tokens_per_s == pytest.approx(5.0)
    assert level.requests_per_s == pytest.approx(1.0)
    assert level.goodput_requests_per_s == pytest.approx(0.5)  # B misses the TTFT objective
    assert level.ttft_ms.p50 == pytest.approx(750.0)
    assert level.e2e_ms.mean == pytest.approx(1150.0)
    assert level.tpot_ms.mean == pytest.approx(100.0)
    assert level.itl_ms.count == 5 and level.itl_ms.mean == pytest.approx(140.0)
    assert level.token_counting == "usage"
    assert level.status_counts == {"200": 2}


def test_window_excludes_warmup_requests_from_latency_but_counts_their_tokens() -> None:
    warm = rec(-1.0, [-0.5, 0.1, 0.2], tokens=3)  # started before the window, streams into it
    level = level_metrics([warm, A], concurrency=1, window_start=0.0, window_end=1.0)
    assert level.requests == 1  # only A was started inside the window
    assert level.ttft_ms.p50 == pytest.approx(500.0)
    assert level.output_tokens_per_s == pytest.approx(6.0)  # 2 of warm's tokens + A's 4, over 1 s
    assert level.requests_per_s == pytest.approx(2.0)  # both completed inside the window
    assert level.goodput_requests_per_s is None  # no SLO given


def test_failures_rejections_and_chunk_fallback() -> None:
    no_usage = rec(0.0, [0.1, 0.2, 0.3])
    busy = rec(0.1, [], status=429, ok=False, error="HTTP 429: queue full")
    broken = rec(0.2, [], status=500, ok=False, error="HTTP 500: boom")
    level = level_metrics([no_usage, busy, broken, A], concurrency=4, window_start=0.0, window_end=1.0)
    assert (level.requests, level.completed, level.failed, level.rejected) == (4, 2, 1, 1)
    assert level.error_rate == pytest.approx(0.25)  # the 429 is not a backend failure
    assert level.status_counts == {"200": 2, "429": 1, "500": 1}
    assert level.error_samples == ["HTTP 500: boom"]
    assert level.token_counting == "mixed"
    assert level.output_tokens == 7
