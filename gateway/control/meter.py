"""Throughput *at one limit*: the measurement a probe is judged on.

A sliding window mixes samples from before and after a limit change, so judging a probe on the window
alone means waiting a whole window per step. When the caller passes the cumulative count of output
tokens streamed (``tokens_total``), the meter measures exactly the interval since the limit settled,
and a probe needs seconds, not a window. Without it the meter falls back to the window's rate, and only
once the window lies entirely after the change (slower, never wrong).
"""

from __future__ import annotations

from collections import deque

from gateway.control.observation import Observation

_MAX_SPAN_STRETCH = 3.0  # readings last at most this many times measure_s on a slow backend


class ThroughputMeter:
    """Output tokens/s between two ticks, from the cumulative counter or the window."""

    def __init__(self, keep_s: float = 600.0) -> None:
        self._keep_s = keep_s
        self._totals: deque[tuple[float, float]] = deque()  # (tick time, cumulative tokens)
        self._window_rate = 0.0
        self._window_span = 0.0
        self._now: float | None = None

    def record(self, now: float, tokens_total: float | None, window_rate: float, window_span: float) -> None:
        self._now = now
        self._window_rate = window_rate
        self._window_span = window_span
        if tokens_total is None:
            self._totals.clear()
            return
        if self._totals and tokens_total < self._totals[-1][1]:
            self._totals.clear()  # the counter was reset (a new upstream object): start over
        self._totals.append((now, float(tokens_total)))
        while self._totals and self._totals[0][0] < now - self._keep_s:
            self._totals.popleft()

    @property
    def exact(self) -> bool:
        """Whether rates come from the cumulative counter (any interval) or the window (whole windows)."""
        return bool(self._totals)

    def rate_since(self, since: float) -> float | None:
        """Mean output tokens/s over ``[since, now]``; None when that interval cannot be measured."""
        now = self._now
        if now is None or now <= since:
            return None
        if self._totals:
            start = next((total for t, total in self._totals if t >= since - 1e-9), None)
            if start is None:
                return None
            first_t = next(t for t, _ in self._totals if t >= since - 1e-9)
            if now - first_t <= 0:
                return None
            return (self._totals[-1][1] - start) / (now - first_t)
        if now - since >= self._window_span - 1e-9 and self._window_span > 0:
            return self._window_rate
        return None


class LimitHistory:
    """When the limit had which value, to average it over a window (the TPOT predictor's calibration)."""

    def __init__(self, keep_s: float = 600.0) -> None:
        self._keep_s = keep_s
        self._changes: deque[tuple[float, int]] = deque()

    def set(self, now: float, limit: int) -> None:
        if self._changes and self._changes[-1][1] == limit:
            return
        self._changes.append((now, limit))
        while len(self._changes) > 1 and self._changes[1][0] < now - self._keep_s:
            self._changes.popleft()

    def mean(self, start: float, end: float) -> float | None:
        """Time-weighted mean limit over ``[start, end]`` (None before the first value)."""
        if not self._changes or end <= start:
            return None
        total = 0.0
        covered = 0.0
        items = list(self._changes)
        for i, (t, limit) in enumerate(items):
            t_next = items[i + 1][0] if i + 1 < len(items) else end
            lo, hi = max(t, start), min(t_next, end)
            if hi > lo:
                total += limit * (hi - lo)
                covered += hi - lo
        if covered <= 0:
            return float(items[-1][1]) if items[-1][0] <= start else None
        return total / covered


class Readings:
    """When throughput measures the current limit, and the readings taken at it.

    A limit is *steady* once ``settle_s`` passed since it changed, the requests admitted under a
    higher one drained, and it has been the bottleneck since (otherwise the reading measures demand,
    not the backend). A reading covers ``measure_s`` of steady time and is taken once: the next one
    starts where it ended, so readings pooled on the curve are independent.
    """

    def __init__(self, settle_s: float, measure_s: float) -> None:
        self.settle_s, self.measure_s = settle_s, measure_s
        self.meter = ThroughputMeter()
        self.changed_at: float | None = None
        self.steady_since: float | None = None
        self.taken = 0  # readings taken since the limit last changed
        self.started = 0.0  # when the latest reading started
        self._last = 0.0  # the latest reading (tokens/s)
        self._peak = 0.0  # the highest reading ever: the reference a reading's length scales to

    def limit_changed(self, now: float) -> None:
        self.changed_at, self.steady_since, self.taken = now, None, 0

    def observe(self, obs: Observation, limit: int, bottleneck: bool) -> None:
        if self.changed_at is None:
            self.changed_at = obs.now
        self.meter.record(obs.now, obs.tokens_total, obs.tokens_per_s, obs.window_s)
        settled = obs.now - self.changed_at >= self.settle_s and obs.inflight <= limit
        if not (settled and bottleneck):
            self.steady_since = None
        elif self.steady_since is None:
            self.steady_since = obs.now

    def take(self, now: float, *, short: bool = False) -> float | None:
        """A reading, if one is due. ``short``: half length (slow start's first reading at a doubled
        limit only has to tell doubling from not, and a short one keeps time past a cliff short).
        Otherwise a slower backend (fewer tokens and prompts per second, so noisier readings) gets
        longer readings, to keep their token count."""
        span = self.measure_s / 2 if short else self.measure_s
        if not short and self._last:
            span *= min(_MAX_SPAN_STRETCH, max(1.0, self._peak / self._last))
        if self.steady_since is None or now - self.steady_since < span - 1e-9:
            return None
        rate = self.meter.rate_since(self.steady_since)
        if rate is not None:
            self.started, self.steady_since = self.steady_since, now
            self.taken += 1
            self._last, self._peak = rate, max(self._peak, rate)
        return rate
