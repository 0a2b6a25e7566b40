"""Rolling statistics of a running load generator, for live displays (the demo's client-side view).

Feed :meth:`LiveWindow.add` from a generator's ``on_record`` and :meth:`LiveWindow.observe` from its
:meth:`stats` on each display tick. Token rate comes from the streamed-chunk counter (live even while
long requests run); latency percentiles from the requests that finished in the horizon. Pure: the
caller passes ``now`` (``time.perf_counter()``, the clock the records use).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from gateway.sweep.client import RequestRecord
from gateway.sweep.loadgen import PoolStats


@dataclass(frozen=True, slots=True)
class LiveStats:
    horizon_s: float
    chunks_per_s: float  # ~ output tokens/s for servers that stream one token per chunk
    requests_per_s: float  # successful completions
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    ok: int
    failed: int
    rejected: int
    in_flight: int
    waiting: int


class LiveWindow:
    def __init__(self, horizon_s: float = 10.0) -> None:
        if horizon_s <= 0:
            raise ValueError("horizon_s must be positive")
        self.horizon_s = horizon_s
        self._records: deque[RequestRecord] = deque()
        self._counts: deque[tuple[float, int]] = deque()  # (time, chunks so far)
        self._in_flight = self._waiting = 0
        self._first: float | None = None  # when observation began: early windows are shorter

    def add(self, record: RequestRecord) -> None:
        if self._first is None:
            self._first = record.start
        self._records.append(record)

    def observe(self, now: float, stats: PoolStats) -> None:
        if self._first is None:
            self._first = now
        self._counts.append((now, stats.chunks))
        self._in_flight, self._waiting = stats.in_flight, stats.waiting

    def snapshot(self, now: float) -> LiveStats:
        cutoff = now - self.horizon_s
        while self._records and (self._records[0].end or 0.0) < cutoff:
            self._records.popleft()
        while len(self._counts) > 2 and self._counts[1][0] <= cutoff:
            self._counts.popleft()
        recent = [r for r in self._records if r.end is not None and r.end >= cutoff]
        ok = [r for r in recent if r.ok]
        chunks_per_s = 0.0
        if len(self._counts) >= 2 and self._counts[-1][0] > self._counts[0][0]:
            (t0, c0), (t1, c1) = self._counts[0], self._counts[-1]
            chunks_per_s = (c1 - c0) / (t1 - t0)
        span = max(min(self.horizon_s, now - (now if self._first is None else self._first)), 1e-9)

        def p99(values: list[float]) -> float | None:
            return float(np.percentile(values, 99)) * 1000.0 if values else None

        return LiveStats(
            horizon_s=self.horizon_s,
            chunks_per_s=chunks_per_s,
            requests_per_s=len(ok) / span if ok else 0.0,
            ttft_p99_ms=p99([r.ttft for r in ok if r.ttft is not None]),
            tpot_p99_ms=p99([t for t in (r.tpot for r in ok) if t is not None]),
            ok=len(ok),
            failed=sum(1 for r in recent if not r.ok and not r.rejected),
            rejected=sum(1 for r in recent if r.rejected),
            in_flight=self._in_flight,
            waiting=self._waiting,
        )
