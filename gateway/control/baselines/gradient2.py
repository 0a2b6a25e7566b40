"""Netflix concurrency-limits' ``Gradient2Limit``: a short-term RTT against a long-term average.

Reference: https://github.com/Netflix/concurrency-limits,
``concurrency-limits-core/src/main/java/com/netflix/concurrency/limits/limit/Gradient2Limit.java`` (and
``limit/measurement/ExpAvgMeasurement.java``). Published defaults (its ``Builder``): ``initialLimit`` 20,
``minLimit`` 20, ``maxConcurrency`` 200, ``smoothing`` 0.2, ``queueSize`` 4, ``longWindow`` 600,
``rttTolerance`` 1.5.

Per sample: the long RTT is an exponential average over ``longWindow`` samples (a plain mean over the first
10); when it is more than twice the sample it decays by 5%. When in-flight is under half the limit
nothing else happens (app-limited). Otherwise gradient = clamp(tolerance x longRtt / rtt, 0.5, 1.0),
new = limit x gradient + queueSize, smoothed as limit x 0.8 + new x 0.2 and clamped to [min, max]. With
a gradient never above 1, growth is the queueSize term: about +0.8 per sample while latency holds.
"""

from __future__ import annotations

from gateway.control.baselines.common import PerRequestLimit

INITIAL_LIMIT = 20
MIN_LIMIT = 20
MAX_CONCURRENCY = 200
SMOOTHING = 0.2
QUEUE_SIZE = 4
LONG_WINDOW = 600
RTT_TOLERANCE = 1.5
WARMUP_WINDOW = 10


class ExpAvg:
    """``ExpAvgMeasurement(window, warmupWindow)``: a mean over the first ``warmup`` samples, then an
    exponential average with factor 2 / (window + 1)."""

    def __init__(self, window: int, warmup: int) -> None:
        self.window, self.warmup = window, warmup
        self.value = 0.0
        self._sum = 0.0
        self._count = 0

    def add(self, sample: float) -> float:
        if self._count < self.warmup:
            self._count += 1
            self._sum += sample
            self.value = self._sum / self._count
        else:
            factor = 2.0 / (self.window + 1)
            self.value = self.value * (1 - factor) + sample * factor
        return self.value


class Gradient2Limit(PerRequestLimit):
    """``Gradient2Limit._update``, one request at a time."""

    name = "gradient2"

    def __init__(
        self,
        *,
        initial_limit: int = INITIAL_LIMIT,
        min_limit: int = MIN_LIMIT,
        max_concurrency: int = MAX_CONCURRENCY,
        smoothing: float = SMOOTHING,
        queue_size: int = QUEUE_SIZE,
        long_window: int = LONG_WINDOW,
        rtt_tolerance: float = RTT_TOLERANCE,
    ) -> None:
        if rtt_tolerance < 1.0:
            raise ValueError("Tolerance must be >= 1.0")
        super().__init__(initial_limit)
        self.estimated_limit = float(initial_limit)
        self.min_limit, self.max_limit = min_limit, max_concurrency
        self.smoothing, self.queue_size, self.tolerance = smoothing, queue_size, rtt_tolerance
        self.long_rtt = ExpAvg(long_window, WARMUP_WINDOW)
        self.last_rtt = 0.0
        self.gradient = 1.0

    def update(self, rtt_s: float, inflight: int, did_drop: bool) -> int:
        estimated = self.estimated_limit
        queue_size = float(self.queue_size)
        self.last_rtt = short_rtt = rtt_s
        long_rtt = self.long_rtt.add(rtt_s)
        if long_rtt / short_rtt > 2:
            self.long_rtt.value *= 0.95
        if inflight < estimated / 2:
            return int(estimated)
        self.gradient = max(0.5, min(1.0, self.tolerance * long_rtt / short_rtt))
        new_limit = estimated * self.gradient + queue_size
        new_limit = estimated * (1 - self.smoothing) + new_limit * self.smoothing
        new_limit = max(float(self.min_limit), min(float(self.max_limit), new_limit))
        self.estimated_limit = new_limit
        return int(new_limit)
