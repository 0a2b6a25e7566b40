"""Throughput *at one limit*: the measurement a probe is judged on.

A sliding window mixes samples from before and after a limit change, so judging a probe on the window
alone means waiting a whole window per step. When the caller passes a cumulative count of output tokens
(``tokens_total``, chosen by :mod:`gateway.control.accounting`), the meter measures exactly the interval
since the limit settled, and a probe needs seconds, not a window. Without it the meter falls back to the
window's rate, and only once the window lies entirely after the change (slower, never wrong).

Non-streamed requests tell their tokens only when they end. The gateway's own count then credits each
one evenly over its life (a :class:`~gateway.control.window.Span`), and a reading is *final* only once no
request admitted before its end is still in flight: until then the reading is pending and the limit is
held. A limit settles as with streams (``settle_s``, in-flight drained to it), not once the requests
admitted under the old limit ended: their spans spread the old limit's pace a little into the new one's
first reading, which is biased anyway and only stands in until a settled one (the scenarios converged
later and no closer when a new limit waited for them). A request that never ends (a stuck generation)
would hold the controller forever, so after ``PENDING_MAX_S`` a reading is taken with what is known.
"""

from __future__ import annotations

from collections import deque

from gateway.control.observation import Observation
from gateway.control.window import Span

_MAX_SPAN_STRETCH = 3.0  # readings last at most this many times measure_s on a slow backend
PENDING_MAX_S = 120.0  # the longest a reading (or a settle) waits for non-streamed requests to end


class ThroughputMeter:
    """Output tokens/s over an interval between two ticks, from a cumulative count or the window."""

    def __init__(self, keep_s: float = 600.0) -> None:
        self._keep_s = keep_s
        self._totals: deque[tuple[float, float]] = deque()  # (when counted, cumulative tokens)
        self._spans: deque[Span] = deque()  # non-streamed requests, credited over their lives
        self._source: str | None = None
        self._pending_since: float | None = None
        self._window_rate = 0.0
        self._window_span = 0.0
        self._now: float | None = None

    def record(
        self,
        now: float,
        tokens_total: float | None,
        window_rate: float,
        window_span: float,
        *,
        at: float | None = None,
        source: str = "gateway",
        spans: tuple[Span, ...] = (),
        pending_since: float | None = None,
    ) -> None:
        """One tick. ``at``: when ``tokens_total`` was counted (a scrape's time; default ``now``)."""
        self._now = now
        self._window_rate = window_rate
        self._window_span = window_span
        self._pending_since = pending_since
        if tokens_total is None:
            self._clear(None)
            return
        if source != self._source or (self._totals and tokens_total < self._totals[-1][1]):
            self._clear(source)  # another count, or the counter was reset: start over
        at = now if at is None else at
        if not self._totals or at > self._totals[-1][0]:
            self._totals.append((at, float(tokens_total)))
        self._spans.extend(spans)
        while self._totals and self._totals[0][0] < now - self._keep_s:
            self._totals.popleft()
        while self._spans and self._spans[0].end < now - self._keep_s:
            self._spans.popleft()

    def _clear(self, source: str | None) -> None:
        self._totals.clear()
        self._spans.clear()
        self._source = source

    @property
    def exact(self) -> bool:
        """Whether rates come from a cumulative count (any interval) or the window (whole windows)."""
        return bool(self._totals)

    @property
    def source(self) -> str | None:
        return self._source

    def final(self, end: float) -> bool:
        """Whether every request that ran before ``end`` has told its tokens."""
        return self._pending_since is None or self._pending_since >= end

    def measure(self, begin: float, end: float) -> tuple[float, float, float] | None:
        """Mean output tokens/s over ``[begin, end]``, and the interval the count really covers (a
        backend's counter is read at scrape times, inside the interval); None when it cannot be measured."""
        if end <= begin:
            return None
        if self._totals:
            inside = [(t, total) for t, total in self._totals if begin - 1e-9 <= t <= end + 1e-9]
            if len(inside) < 2 or inside[-1][0] - inside[0][0] <= 0:
                return None
            (t0, first), (t1, last) = inside[0], inside[-1]
            tokens = last - first + sum(span.tokens_in(t0, t1) for span in self._spans)
            return tokens / (t1 - t0), t0, t1
        if end == self._now and end - begin >= self._window_span - 1e-9 and self._window_span > 0:
            return self._window_rate, begin, end
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
        self.pending: tuple[float, float] | None = None  # a reading's interval, waiting for its requests

    def limit_changed(self, now: float) -> None:
        self.changed_at, self.steady_since, self.taken, self.pending = now, None, 0, None

    def observe(self, obs: Observation, limit: int, bottleneck: bool) -> None:
        if self.changed_at is None:
            self.changed_at = obs.now
        meter = self.meter
        meter.record(
            obs.now,
            obs.tokens_total,
            obs.tokens_per_s,
            obs.window_s,
            at=obs.tokens_at,
            source=obs.tokens_source,
            spans=obs.token_spans,
            pending_since=obs.tokens_pending_since,
        )
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
        if self.pending is not None:
            begin, end = self.pending
            if not self.meter.final(end) and now - end < PENDING_MAX_S:
                return None
            self.pending = None
            return self._taken(self.meter.measure(begin, end))
        span = self.measure_s / 2 if short else self.measure_s
        if not short and self._last:
            span *= min(_MAX_SPAN_STRETCH, max(1.0, self._peak / self._last))
        if self.steady_since is None or now - self.steady_since < span - 1e-9:
            return None
        begin = self.steady_since
        if not self.meter.final(now):  # non-streamed requests still running in it: wait for their counts
            self.pending, self.steady_since = (begin, now), now
            return None
        measured = self.meter.measure(begin, now)
        if measured is None or measured[2] - measured[1] < span - 1e-9:
            return None  # a scraped count has not covered the whole reading yet: the next scrape will
        self.steady_since = measured[2]  # the next reading starts where this one's count ended
        return self._taken(measured)

    def _taken(self, measured: tuple[float, float, float] | None) -> float | None:
        if measured is None:
            return None
        rate, self.started, _ = measured
        self.taken += 1
        self._last, self._peak = rate, max(self._peak, rate)
        return rate
