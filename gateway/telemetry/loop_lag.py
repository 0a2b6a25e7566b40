"""Event-loop lag: how late a periodic timer fires on the gateway's one event loop.

Every request, stream chunk and controller tick of a gateway runs on a single asyncio loop. When the
loop is busy (too many streams, a slow callback, a GC pause), every timer and every ready socket waits,
and each stream's next chunk is late by the same amount. That wait is visible before CPU or latency
percentiles move, so it is the first sign that one process has reached what it can proxy.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import Gauge, Histogram


class LoopLagProbe:
    """Call :meth:`tick` every ``interval_s`` from the loop being measured; each call records how much later
    than ``interval_s`` after the previous one it ran."""

    def __init__(
        self, interval_s: float, gauge: Gauge, histogram: Histogram, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self._gauge, self._histogram, self._clock = gauge, histogram, clock
        self._last: float | None = None
        self.latest: float | None = None

    async def tick(self) -> None:
        now = self._clock()
        if self._last is not None:
            lag = max(0.0, now - self._last - self.interval_s)
            self.latest = lag
            self._gauge.set(lag)
            self._histogram.observe(lag)
        self._last = now
