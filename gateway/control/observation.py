"""What the controller sees of one upstream at one tick: the :class:`Observation`, and its pure builder.

The gateway (and the scenario harness) gather four things each tick: the sliding window's statistics,
the limiter's numbers, the last headroom readings (NVML, the backend's own ``/metrics``) and, when it
knows one, the upstream's hard cap. :func:`observe` folds them into one flat, frozen value so a
controller step is a function of a single argument, and so a decision log can show exactly what a
decision saw. Headroom readings carry their age: a reading nobody refreshed is worse than none, and
the controller must be able to tell the two apart from "the backend is fine".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gateway.control.share import Peers
from gateway.control.window import Outcome, RequestSample, Span, WindowStats, percentile


@dataclass(frozen=True, slots=True)
class GpuHeadroom:
    """One GPU as NVML last saw it. ``utilization`` is 0-1 (None when the driver does not report it)."""

    index: int
    memory_total_bytes: int
    memory_free_bytes: int
    utilization: float | None = None
    name: str = ""

    @property
    def memory_free_ratio(self) -> float:
        if self.memory_total_bytes <= 0:
            return 0.0
        return min(max(self.memory_free_bytes / self.memory_total_bytes, 0.0), 1.0)


@dataclass(frozen=True, slots=True)
class LimiterState:
    """The limiter's numbers at the tick. ``peak_inflight`` is the highest in-flight count since the
    previous tick (``Limiter.take_peak()``): the instantaneous count can miss a burst between ticks."""

    limit: int
    inflight: int
    peak_inflight: int
    queue_depth: int

    @property
    def full(self) -> bool:
        """Whether the limit held anyone back since the last tick: a queue, or in flight reached it."""
        return self.queue_depth > 0 or max(self.peak_inflight, self.inflight) >= self.limit


@dataclass(frozen=True, slots=True)
class Headroom:
    """The last headroom readings for one upstream, each stamped with *when* it was read (on the same
    monotonic clock as the tick's ``now``). ``None`` means never read or not reported by this backend.

    GPU readings come from :mod:`gateway.telemetry.nvml`; the backend fields from the upstream's
    ``/metrics`` adapter (vLLM, llama-server). ``gpus_reason`` says why there are no GPU readings.
    """

    gpus: tuple[GpuHeadroom, ...] = ()
    gpus_at: float | None = None
    gpus_reason: str | None = None
    kv_usage: float | None = None
    backend_running: int | None = None
    backend_waiting: int | None = None
    preemptions_total: float | None = None
    # the backend's count of generated tokens, all clients together; ``live`` when it moves as tokens are
    # made (vLLM counts per engine step), not when requests end (llama-server)
    generation_tokens_total: float | None = None
    generation_tokens_live: bool = False
    backend_at: float | None = None


NO_HEADROOM = Headroom()


@dataclass(frozen=True, slots=True)
class TokenCount:
    """The cumulative count of output tokens the throughput meter reads at one tick, and what it is.

    ``source`` is ``"gateway"`` (the gateway's own count: streamed tokens as they arrived, plus ``spans``,
    the non-streamed requests that ended since the last tick, and ``pending_since``, when the oldest one
    still in flight was admitted) or ``"backend"`` (this gateway's share of the backend's own live
    counter, read at ``at``, a scrape's time). :mod:`gateway.control.accounting` chooses."""

    total: float
    at: float
    source: str = "gateway"
    spans: tuple[Span, ...] = ()
    pending_since: float | None = None


@dataclass(frozen=True, slots=True)
class Latency:
    """p99 latencies over a chosen set of successful requests, and how many there were."""

    samples: int
    ttft_p99: float | None  # net of the gateway's queue
    tpot_p99: float | None
    tpot_p50: float | None
    ttft_samples: int  # how many requests ttft_p99 is over

    @classmethod
    def of(cls, samples: list[RequestSample], first_tokens: list[RequestSample] | None = None) -> Latency:
        """Over ``samples``; TTFT over ``first_tokens`` instead, when given (a subset: the requests whose
        first token speaks for the limit, where every one's decoding does)."""
        ok = [s for s in samples if s.outcome is Outcome.OK]
        tpot = [v for v in (s.tpot for s in ok) if v is not None]
        timed = ok if first_tokens is None else [s for s in first_tokens if s.outcome is Outcome.OK]
        ttft = [v for v in (s.upstream_ttft for s in timed) if v is not None]
        return cls(len(ok), percentile(ttft, 99), percentile(tpot, 99), percentile(tpot, 50), len(timed))

    @classmethod
    def from_stats(cls, stats: WindowStats) -> Latency:
        return cls(stats.ok, stats.upstream_ttft_p99, stats.tpot_p99, stats.tpot_p50, stats.ok)


@dataclass(frozen=True, slots=True)
class Observation:
    """One window of one upstream, as the controller sees it. Latencies in seconds; ages in seconds
    (``None``: unknown). Only ``upstream_errors`` and ``timeouts`` count as failures: client
    cancellations and 4xx answers say nothing about the backend's capacity."""

    now: float
    window_s: float
    # throughput and latency (window statistics)
    tokens_per_s: float
    tokens_total: float | None  # the cumulative output-token count the meter reads, if known
    completed: int
    ok: int
    # p99 latencies over the successful requests *admitted since the last decrease* (older ones ran
    # at a limit that no longer exists), and how many requests that is; TTFT leaves out a burst's
    # requests (``ttft_samples`` of them count)
    latency_samples: int
    ttft_samples: int
    ttft_p99: float | None  # net of the gateway's queue: what the backend caused
    tpot_p99: float | None
    tpot_p50: float | None
    upstream_errors: int
    timeouts: int
    # the limiter
    limit: int
    inflight: int
    peak_inflight: int
    queue_depth: int
    hard_cap: int | None
    # headroom, each with its age
    gpu_memory_free_min: float | None = None  # the tightest GPU's free/total
    gpu_utilization_max: float | None = None
    gpus_age_s: float | None = None
    kv_usage: float | None = None
    kv_usage_age_s: float | None = None
    backend_running: int | None = None
    backend_running_age_s: float | None = None
    backend_waiting: int | None = None
    backend_waiting_age_s: float | None = None
    preemptions_total: float | None = None
    preemptions_age_s: float | None = None
    gpus: tuple[GpuHeadroom, ...] = field(default=(), repr=False)
    # what ``tokens_total`` is (see TokenCount): when it was counted (None: now), its source, the
    # non-streamed requests that ended since the last tick and the oldest one still in flight
    tokens_at: float | None = None
    tokens_source: str = "gateway"
    token_spans: tuple[Span, ...] = field(default=(), repr=False)
    tokens_pending_since: float | None = None
    # the other replicas in front of the same backend, from shared state (None: none known)
    peers: Peers | None = None

    @property
    def failures(self) -> int:
        return self.upstream_errors + self.timeouts

    @property
    def bottleneck(self) -> bool:
        """Whether the limit held anyone back since the last tick: a queue, or in-flight reached it.
        When not, raising the limit cannot change anything, so the controller must not (idle drift)."""
        return self.queue_depth > 0 or self.peak_inflight >= self.limit

    def as_dict(self) -> dict[str, Any]:
        """The flat numbers (no per-GPU detail), rounded for logs and the JSON state view."""
        out: dict[str, Any] = {}
        if self.peers is not None:
            out["peers"] = {
                "replicas": self.peers.replicas,
                "demand": round(self.peers.demand, 2),
                "limit": self.peers.limit,
                "age_s": round(self.peers.age_s, 2),
                "leader": None if self.peers.leader is None else self.peers.leader.replica,
            }
        for name, value in asdict(self).items():
            if name in ("gpus", "token_spans", "peers"):
                continue
            out[name] = round(value, 4) if isinstance(value, float) else value
        return out


def _age(now: float, at: float | None, value: object) -> float | None:
    if value is None or at is None:
        return None
    return max(now - at, 0.0)


def observe(
    now: float,
    stats: WindowStats,
    limiter: LimiterState,
    headroom: Headroom = NO_HEADROOM,
    *,
    hard_cap: int | None = None,
    tokens_total: float | None = None,
    latency: Latency | None = None,
    count: TokenCount | None = None,
    peers: Peers | None = None,
) -> Observation:
    """Fold one tick's inputs into an :class:`Observation`. Pure: ``now`` is the caller's clock.
    ``latency`` defaults to the whole window's percentiles; ``count``, when given, is the token count
    the meter reads (``tokens_total`` is then ignored)."""
    gpus = headroom.gpus
    if latency is None:
        latency = Latency.from_stats(stats)
    if count is not None:
        tokens_total = count.total
    return Observation(
        now=now,
        window_s=stats.span_s,
        tokens_per_s=stats.output_tokens_per_s,
        tokens_total=tokens_total,
        completed=stats.completed,
        ok=stats.ok,
        latency_samples=latency.samples,
        ttft_samples=latency.ttft_samples,
        ttft_p99=latency.ttft_p99,
        tpot_p99=latency.tpot_p99,
        tpot_p50=latency.tpot_p50,
        upstream_errors=stats.upstream_errors,
        timeouts=stats.timeouts,
        limit=limiter.limit,
        inflight=limiter.inflight,
        peak_inflight=max(limiter.peak_inflight, limiter.inflight),
        queue_depth=limiter.queue_depth,
        hard_cap=hard_cap if hard_cap is None or hard_cap > 0 else None,
        gpu_memory_free_min=min((g.memory_free_ratio for g in gpus), default=None),
        gpu_utilization_max=max((g.utilization for g in gpus if g.utilization is not None), default=None),
        gpus_age_s=_age(now, headroom.gpus_at, gpus or None),
        kv_usage=headroom.kv_usage,
        kv_usage_age_s=_age(now, headroom.backend_at, headroom.kv_usage),
        backend_running=headroom.backend_running,
        backend_running_age_s=_age(now, headroom.backend_at, headroom.backend_running),
        backend_waiting=headroom.backend_waiting,
        backend_waiting_age_s=_age(now, headroom.backend_at, headroom.backend_waiting),
        preemptions_total=headroom.preemptions_total,
        preemptions_age_s=_age(now, headroom.backend_at, headroom.preemptions_total),
        gpus=gpus,
        tokens_at=None if count is None else count.at,
        tokens_source="gateway" if count is None else count.source,
        token_spans=() if count is None else count.spans,
        tokens_pending_since=None if count is None else count.pending_since,
        peers=peers,
    )
