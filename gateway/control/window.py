"""Per-request samples and the sliding window that turns them into statistics.

The proxy records one :class:`RequestSample` per finished request and feeds streamed output tokens to
:meth:`SlidingWindow.add_tokens` as they arrive, so throughput is measured while long streams run
instead of being credited in a lump when they end. A request that is not streamed shows its tokens only
when it ends, all at once: the window keeps it as a :class:`Span` (its tokens spread evenly over its
life, the only honest guess of when they were made) and knows which such requests are still open, so a
reading over an interval can wait until every request that ran in it has told its count
(:mod:`gateway.control.knee_search.meter`). Everything here is pure: times are plain floats from whatever monotonic
clock the caller uses, and nothing sleeps or reads a clock itself.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import Enum


class Outcome(str, Enum):
    """How a request ended. Only ``UPSTREAM_ERROR`` and ``TIMED_OUT`` count as congestion signals."""

    OK = "ok"
    UPSTREAM_ERROR = "upstream_error"
    CLIENT_CANCELLED = "client_cancelled"
    TIMED_OUT = "timed_out"
    CLIENT_ERROR = "client_error"  # the upstream answered 4xx: the request was bad, not the server
    SHUT_DOWN = "shut_down"  # the gateway's drain deadline ended it


@dataclass(frozen=True, slots=True)
class RequestSample:
    """One admitted request, from arrival at the gateway to its last byte."""

    arrived: float
    admitted: float
    finished: float
    first_token: float | None
    prompt_tokens: int
    output_tokens: int
    outcome: Outcome
    streamed: bool = True

    @property
    def queue_wait(self) -> float:
        return self.admitted - self.arrived

    @property
    def e2e(self) -> float:
        """Client-seen latency, queue wait included."""
        return self.finished - self.arrived

    @property
    def ttft(self) -> float | None:
        """Time to first token as the client saw it (from arrival)."""
        return None if self.first_token is None else self.first_token - self.arrived

    @property
    def upstream_ttft(self) -> float | None:
        """Time to first token net of the gateway's queue (from admission): what the backend caused."""
        return None if self.first_token is None else self.first_token - self.admitted

    @property
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1), as ``vllm bench serve`` defines it; None below 2 tokens."""
        if self.first_token is None or self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class Span:
    """A non-streamed request's output tokens, credited evenly over its life from admission to its end."""

    start: float
    end: float
    tokens: int

    def tokens_in(self, begin: float, end: float) -> float:
        """The share of the tokens that falls inside ``[begin, end]``."""
        if self.end <= self.start:
            return float(self.tokens) if begin <= self.end <= end else 0.0
        overlap = max(0.0, min(self.end, end) - max(self.start, begin))
        return self.tokens * overlap / (self.end - self.start)


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class WindowStats:
    """What one window of samples says. Latency percentiles cover successful requests only."""

    span_s: float
    completed: int
    ok: int
    upstream_errors: int
    timeouts: int
    cancelled: int
    client_errors: int
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_p50: float | None
    ttft_p99: float | None
    upstream_ttft_p50: float | None
    upstream_ttft_p99: float | None
    tpot_p50: float | None
    tpot_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    queue_wait_p50: float | None
    queue_wait_p99: float | None
    mean_output_tokens: float | None
    mean_prompt_tokens: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in self.__slots__}


class SlidingWindow:
    """Samples and token progress of the last ``horizon_s`` seconds.

    Token progress is kept in one-second buckets so a window costs O(horizon) memory however many
    chunks stream through it; samples are kept individually because percentiles need them.
    """

    def __init__(self, horizon_s: float, *, bucket_s: float = 1.0) -> None:
        if horizon_s <= 0 or bucket_s <= 0:
            raise ValueError("horizon_s and bucket_s must be positive")
        self.horizon_s = horizon_s
        self.bucket_s = bucket_s
        self._samples: deque[RequestSample] = deque()
        self._token_buckets: deque[list[float]] = deque()  # [bucket start, tokens]
        self._started: float | None = None
        self.tokens_total = 0.0  # every token ever credited, as it became visible
        self.streamed_total = 0.0  # the streamed ones: credited as they were made
        self._spans: deque[tuple[int, Span]] = deque()  # non-streamed requests, numbered in order
        self._spans_seen = 0
        self._span_keep_s = max(horizon_s, 120.0)  # long enough for the meter to collect them
        self._open: dict[int, float] = {}  # non-streamed requests in flight: key -> admitted
        self._open_keys = 0
        self.unstreamed_at: float | None = None  # when a non-streamed request last ended with tokens

    def start(self, now: float) -> None:
        """Mark when measuring began, so an early window's rate is not divided by a span it never saw."""
        if self._started is None:
            self._started = now

    def add(self, sample: RequestSample) -> None:
        """One finished request. A non-streamed one brings its tokens too (its stream never did): they
        count in the window's rate at its end, and as a :class:`Span` for the meter."""
        self.start(sample.arrived)
        self._samples.append(sample)
        if not sample.streamed and sample.output_tokens > 0:
            self.add_tokens(sample.finished, sample.output_tokens, streamed=False)
            self._spans_seen += 1
            self._spans.append((self._spans_seen, Span(sample.admitted, sample.finished, sample.output_tokens)))
            self.unstreamed_at = sample.finished
        self.prune(sample.finished)  # here, not only when read: memory stays flat when nobody reads

    def opened(self, admitted: float) -> int:
        """A non-streamed request was sent upstream: until :meth:`closed`, readings that overlap its life
        are not final. Returns the key to close it with."""
        self._open_keys += 1
        self._open[self._open_keys] = admitted
        return self._open_keys

    def closed(self, key: int) -> None:
        self._open.pop(key, None)

    @property
    def pending_since(self) -> float | None:
        """When the oldest non-streamed request still in flight was admitted (None: none is)."""
        return min(self._open.values(), default=None)

    def spans_after(self, seen: int) -> tuple[int, list[Span]]:
        """Non-streamed requests recorded after the ``seen``-th one, and the number of the last one."""
        return self._spans_seen, [span for number, span in self._spans if number > seen]

    def add_tokens(self, now: float, count: int, *, streamed: bool = True) -> None:
        """Credit ``count`` output tokens (negative corrections allowed) to the bucket holding ``now``: a stream's
        as they arrive, a non-streamed request's at its end (``streamed=False``, from :meth:`add`). One call on
        the path taken per streamed read."""
        if count == 0:
            return
        if self._started is None:  # start(now), without the call
            self._started = now
        if streamed:
            self.streamed_total += count
        self.tokens_total += count
        start = now - (now % self.bucket_s)
        buckets = self._token_buckets
        if buckets and buckets[-1][0] == start:
            buckets[-1][1] += count
        else:
            buckets.append([start, float(count)])

    def prune(self, now: float) -> None:
        cutoff = now - self.horizon_s
        while self._samples and self._samples[0].finished < cutoff:
            self._samples.popleft()
        while self._token_buckets and self._token_buckets[0][0] + self.bucket_s <= cutoff:
            self._token_buckets.popleft()
        while self._spans and self._spans[0][1].end < now - self._span_keep_s:
            self._spans.popleft()

    def samples(self, now: float) -> list[RequestSample]:
        self.prune(now)
        return list(self._samples)

    def stats(self, now: float) -> WindowStats:
        """Statistics over ``[now - horizon, now]`` (or since the first sample, if more recent)."""
        self.prune(now)
        # The span the counts cover: the horizon, or less right after start-up, or a little more
        # when the oldest one-second token bucket straddles the horizon's edge.
        begin = now - self.horizon_s if self._started is None else max(self._started, now - self.horizon_s)
        if self._token_buckets and self._token_buckets[0][0] < begin:
            begin = self._token_buckets[0][0]
        span = max(now - begin, 1e-9)
        samples = list(self._samples)
        ok = [s for s in samples if s.outcome is Outcome.OK]
        tokens = sum(bucket[1] for bucket in self._token_buckets)

        def pct(values: list[float], q: float) -> float | None:
            return percentile(values, q)

        ttft = [v for v in (s.ttft for s in ok) if v is not None]
        up_ttft = [v for v in (s.upstream_ttft for s in ok) if v is not None]
        tpot = [v for v in (s.tpot for s in ok) if v is not None]
        e2e = [s.e2e for s in ok]
        waits = [s.queue_wait for s in samples]
        count = {outcome: 0 for outcome in Outcome}
        for sample in samples:
            count[sample.outcome] += 1
        return WindowStats(
            span_s=span,
            completed=len(samples),
            ok=count[Outcome.OK],
            upstream_errors=count[Outcome.UPSTREAM_ERROR],
            timeouts=count[Outcome.TIMED_OUT],
            cancelled=count[Outcome.CLIENT_CANCELLED],
            client_errors=count[Outcome.CLIENT_ERROR],
            output_tokens=int(tokens),
            output_tokens_per_s=tokens / span,
            requests_per_s=len(samples) / span,
            ttft_p50=pct(ttft, 50),
            ttft_p99=pct(ttft, 99),
            upstream_ttft_p50=pct(up_ttft, 50),
            upstream_ttft_p99=pct(up_ttft, 99),
            tpot_p50=pct(tpot, 50),
            tpot_p99=pct(tpot, 99),
            e2e_p50=pct(e2e, 50),
            e2e_p99=pct(e2e, 99),
            queue_wait_p50=pct(waits, 50),
            queue_wait_p99=pct(waits, 99),
            mean_output_tokens=(sum(s.output_tokens for s in ok) / len(ok)) if ok else None,
            mean_prompt_tokens=(sum(s.prompt_tokens for s in ok) / len(ok)) if ok else None,
        )
