"""Per-level metrics from request records, with the definitions of ``vllm bench serve``.

- TTFT: send to first chunk. E2E: send to last data message. ITL: gaps between successive chunks,
  pooled over all requests. TPOT: (E2E - TTFT) / (output tokens - 1), only for requests with more than
  one output token. Each reported as mean, p50, p90, p99 (numpy's linear-interpolated percentiles).
- Goodput: requests meeting *every* SLO (TTFT <= x, TPOT <= y, E2E <= z; a one-token request counts
  TPOT 0, as vLLM does) per second.

Where we differ from ``vllm bench serve``, on purpose: vLLM sends a fixed batch and divides by the whole
run, ramp-up and drain included. A sweep wants the steady state *at* N in flight, so each level has a
measurement window [start, end): warm-up before it is excluded, and the drain after it (when fewer than
N requests remain) too. Throughput counts the output tokens that *arrived* inside the window, whatever
request they belong to (usage-reported tokens spread evenly over the request's chunks); latency
statistics cover the requests *started* inside it, each followed to its end. Requests/s counts
successful completions inside the window. Everything here is pure: no clock, no I/O.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from gateway.sweep.client import RequestRecord
from gateway.sweep.result import SLO, LevelMetrics, Stats, TokenCounting

MAX_ERROR_SAMPLES = 5


def summarize(values: Sequence[float], scale: float = 1.0) -> Stats:
    """Mean/p50/p90/p99 of ``values`` times ``scale`` (1000 turns seconds into ms)."""
    if not values:
        return Stats()
    array = np.asarray(values, dtype=float) * scale
    p50, p90, p99 = np.percentile(array, [50, 90, 99])
    return Stats(count=len(values), mean=float(array.mean()), p50=float(p50), p90=float(p90), p99=float(p99))


def tokens_in_window(records: Iterable[RequestRecord], start: float, end: float) -> float:
    """Output tokens whose chunk arrived in [start, end); a request's tokens spread evenly over its chunks."""
    total = 0.0
    for record in records:
        times = record.chunk_times
        if not times or times[-1] < start or times[0] >= end:
            continue
        per_chunk = record.output_tokens / len(times)
        inside = bisect.bisect_left(times, end) - bisect.bisect_left(times, start)
        total += inside * per_chunk
    return total


def meets_slo(record: RequestRecord, slo: SLO) -> bool:
    """Whether one successful request met every objective (vLLM's goodput rule)."""
    ttft, e2e = record.ttft, record.latency
    if ttft is None or e2e is None:
        return False
    tpot = record.tpot or 0.0
    checks = ((slo.ttft_ms, ttft), (slo.tpot_ms, tpot), (slo.e2e_ms, e2e))
    return all(limit is None or value * 1000.0 <= limit for limit, value in checks)


def token_counting(records: Sequence[RequestRecord]) -> TokenCounting:
    ok = [r for r in records if r.ok]
    if not ok:
        return "none"
    reported = sum(r.usage_reported for r in ok)
    return "usage" if reported == len(ok) else "chunks" if reported == 0 else "mixed"


def status_key(record: RequestRecord) -> str:
    return str(record.status) if record.status is not None else (record.error_kind or "error")


def level_metrics(
    records: Sequence[RequestRecord],
    *,
    concurrency: int,
    window_start: float,
    window_end: float,
    slo: SLO | None = None,
    rate: float | None = None,
    timed_out: bool = False,
) -> LevelMetrics:
    """Compute one level's metrics from *all* its records (warm-up and drain included; the window
    decides what counts). ``slo_met`` is left True here; :func:`gateway.sweep.finder.judge` judges."""
    duration = max(window_end - window_start, 1e-9)
    measured = [r for r in records if window_start <= r.start < window_end]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok and not r.rejected]
    rejected = [r for r in measured if r.rejected]
    completed_in_window = sum(1 for r in records if r.ok and r.end is not None and window_start <= r.end < window_end)
    statuses = Counter(status_key(r) for r in measured)
    errors = [r.error for r in measured if r.error and not r.rejected]
    samples = [e for e, _ in Counter(errors).most_common(MAX_ERROR_SAMPLES)]
    goodput = None
    if slo is not None and slo.enabled:
        good_share = sum(meets_slo(r, slo) for r in ok) / len(ok) if ok else 0.0
        goodput = completed_in_window / duration * good_share
    itls = [gap for r in ok for gap in r.itl]
    return LevelMetrics(
        concurrency=concurrency,
        rate=rate,
        duration_s=window_end - window_start,
        requests=len(measured),
        completed=len(ok),
        failed=len(failed),
        rejected=len(rejected),
        status_counts=dict(sorted(statuses.items())),
        error_samples=samples,
        error_rate=len(failed) / len(measured) if measured else 0.0,
        output_tokens=sum(r.output_tokens for r in ok),
        input_tokens=sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in ok),
        output_tokens_per_s=tokens_in_window(records, window_start, window_end) / duration,
        requests_per_s=completed_in_window / duration,
        goodput_requests_per_s=goodput,
        ttft_ms=summarize([r.ttft for r in ok if r.ttft is not None], 1000.0),
        tpot_ms=summarize([t for t in (r.tpot for r in ok) if t is not None], 1000.0),
        itl_ms=summarize(itls, 1000.0),
        e2e_ms=summarize([r.latency for r in ok if r.latency is not None], 1000.0),
        token_counting=token_counting(measured),
        timed_out=timed_out,
    )
