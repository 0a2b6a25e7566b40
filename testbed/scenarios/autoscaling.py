"""Backends that an autoscaler adds and removes, on virtual time: the capacity signal against threshold recipes.

A pool of simulated vLLM servers (:class:`gateway.sim.engine.Engine`, one per backend) under open-loop demand
that ramps from a fraction of one backend's capacity to several backends' worth and back, scaled by the same
autoscaler (the HPA controller's arithmetic, :class:`Hpa`) following one of three metrics:

* ``signal``: ``sweetspot_upstreams_desired``, computed by the real :class:`CapacitySignal` from the real
  per-upstream controllers (:class:`UpstreamControl`) as the gateway's control loop feeds it, with requests
  queued in one gateway queue and dispatched to the upstream with the most free permits under its limit, and
  scaled with the behaviour of ``deploy/k8s/vllm-autoscaling/hpa.yaml`` (an absent figure holds the count).
* ``waiting``: KEDA's usual recipe, ``sum(vllm:num_requests_waiting)`` with an ``AverageValue`` target per
  replica, the HPA's default behaviour (a 300 s scale-down stabilisation window); the clients reach the
  backends directly (round robin, as a Service spreads them), so the backends queue.
* ``gpu_util``: the same on GPU utilisation, as ``DCGM_FI_DEV_GPU_UTIL`` reads it: the share of the last
  sample period (1 s) in which a kernel ran, that is in which the engine was inside a step. An engine with one
  sequence steps back to back, so it reads 100% at batch 1: the recipe's known flaw, modelled as it is.

A backend costs from the moment the autoscaler asks for it (the pod holds its GPU while vLLM loads the model,
``Timing.load_s``) until it is gone: a removed backend takes no new request and finishes what it holds (its
running and waiting sequences), its GPU held until then. Removal takes the newest backend first (a StatefulSet's
highest ordinal; one still loading goes at once). Everything is deterministic from the seed, and every recipe
sees the same arrivals.

Simplified, and said so in docs/deploy.md: one gateway replica; the gateway reads each backend's ``/metrics``
live at its control tick (no scrape lag); no gateway queue limit or timeout; the new backend joins the gateway
the moment it is ready (discovery's lag not modelled); a Service spreads requests round robin (kube-proxy's
iptables mode picks at random, which queues more); a removed backend's waiting requests finish there (vLLM's
graceful shutdown aborts what has not started). Prometheus scrapes every ``scrape_s`` and the HPA syncs every
``sync_s`` on the last scrape.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from gateway.control.capacity_signal import CapacitySignal, Reading
from gateway.control.config import AimdConfig, StartPoint
from gateway.control.controller import UpstreamControl
from gateway.control.knee_search.capacity import Footprint, kv_cap
from gateway.control.observation import Headroom, LimiterState
from gateway.control.window import Outcome, RequestSample, SlidingWindow, percentile
from gateway.settings import Settings
from gateway.sim.engine import Engine, StepResult
from gateway.sim.profiles import Profile
from testbed.scenarios.evaluate import oracle
from testbed.scenarios.harness import Conditions, Workload

Metric = Literal["signal", "waiting", "gpu_util"]
MODEL = "model"  # the one model every backend serves


# --- the demand -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ramp:
    """Arrivals/s over time: ``low`` x capacity for ``hold_s``, linearly up to ``high`` x capacity over ``ramp_s``,
    held ``peak_s``, down again over ``ramp_s``, then ``low`` x capacity for ``tail_s``."""

    capacity_rps: float  # what one backend serves at its sweet spot, requests/s
    low: float = 0.5
    high: float = 3.0
    hold_s: float = 300.0
    ramp_s: float = 900.0
    peak_s: float = 300.0
    tail_s: float = 900.0

    @property
    def duration_s(self) -> float:
        return self.hold_s + 2 * self.ramp_s + self.peak_s + self.tail_s

    def rate(self, t: float) -> float:
        lo, hi = self.low * self.capacity_rps, self.high * self.capacity_rps
        up_end = self.hold_s + self.ramp_s
        down_start = up_end + self.peak_s
        if t < self.hold_s:
            return lo
        if t < up_end:
            return lo + (hi - lo) * (t - self.hold_s) / self.ramp_s
        if t < down_start:
            return hi
        if t < down_start + self.ramp_s:
            return hi - (hi - lo) * (t - down_start) / self.ramp_s
        return lo


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    prompt: int
    output: int


def arrivals(ramp: Ramp, workload: Workload, seed: int) -> list[Arrival]:
    """A Poisson process with the ramp's rate (thinning a process at its peak rate), sizes from ``workload``."""
    rng = random.Random(seed)
    peak = max(ramp.low, ramp.high) * ramp.capacity_rps
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= ramp.duration_s:
            return out
        if rng.random() * peak <= ramp.rate(t):
            prompt, output = workload.draw(rng)
            out.append(Arrival(t, prompt, output))


# --- the autoscaler ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Policy:
    """One HPA scaling policy: at most ``value`` pods (or percent) of change per ``period_s``."""

    kind: Literal["pods", "percent"]
    value: int
    period_s: float


@dataclass(frozen=True, slots=True)
class Rules:
    stabilisation_s: float
    policies: tuple[Policy, ...]  # the one allowing the most change applies (``selectPolicy: Max``)


@dataclass(frozen=True, slots=True)
class Behaviour:
    up: Rules
    down: Rules


#: The HPA's defaults (autoscaling/v2): up at once, by 100% or 4 pods per 15 s; down after a 300 s window.
HPA_DEFAULTS = Behaviour(
    up=Rules(0.0, (Policy("percent", 100, 15.0), Policy("pods", 4, 15.0))),
    down=Rules(300.0, (Policy("percent", 100, 15.0),)),
)
#: deploy/k8s/vllm-autoscaling/hpa.yaml (and keda.yaml): the figure holds its own 300 s hysteresis.
SIGNAL_BEHAVIOUR = Behaviour(
    up=Rules(0.0, (Policy("pods", 4, 60.0),)),
    down=Rules(60.0, (Policy("pods", 1, 120.0),)),
)


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    metric: Metric
    target: float  # the AverageValue target per replica: desired = ceil(sum of the metric / target)
    behaviour: Behaviour
    through_gateway: bool  # requests go through sweetspot (limits, its queue) or straight to the backends


RECIPES: tuple[Recipe, ...] = (
    Recipe("signal", "signal", 1.0, SIGNAL_BEHAVIOUR, True),
    Recipe("waiting", "waiting", 5.0, HPA_DEFAULTS, False),
    Recipe("gpu_util", "gpu_util", 80.0, HPA_DEFAULTS, False),
)


class Hpa:
    """The HPA controller's arithmetic for one metric with an ``AverageValue`` target (KEDA's default): desired
    ``ceil(total / target)`` unless ``total / (target x replicas)`` is within ``tolerance`` of 1; then the
    behaviour's stabilisation windows (up: the lowest recommendation of its window; down: the highest) and its
    rate policies, then ``[min_replicas, max_replicas]``. An absent metric holds the count."""

    def __init__(
        self, recipe: Recipe, replicas: int, min_replicas: int, max_replicas: int, tolerance: float = 0.1
    ) -> None:
        self.recipe = recipe
        self.replicas = replicas
        self.min_replicas, self.max_replicas, self.tolerance = min_replicas, max_replicas, tolerance
        self._recommendations: deque[tuple[float, int]] = deque()
        self._changes: list[tuple[float, int]] = []  # (when, new - old)

    def sync(self, now: float, total: float | None) -> int:
        if total is None:
            return self.replicas
        current, target = self.replicas, self.recipe.target
        ratio = total / (target * current)
        desired = current if abs(ratio - 1.0) <= self.tolerance else math.ceil(total / target - 1e-9)
        desired = min(max(desired, self.min_replicas), self.max_replicas)
        up, down = self.recipe.behaviour.up, self.recipe.behaviour.down
        keep = max(up.stabilisation_s, down.stabilisation_s)
        while self._recommendations and self._recommendations[0][0] <= now - keep:
            self._recommendations.popleft()
        up_rec = min([r for t, r in self._recommendations if t > now - up.stabilisation_s] + [desired])
        down_rec = max([r for t, r in self._recommendations if t > now - down.stabilisation_s] + [desired])
        self._recommendations.append((now, desired))
        proposed = max(current, up_rec) if up_rec > current else min(current, down_rec)
        if proposed > current:
            proposed = min(proposed, self._up_limit(now, current))
        elif proposed < current:
            proposed = max(proposed, self._down_limit(now, current))
        proposed = min(max(proposed, self.min_replicas), self.max_replicas)
        if proposed != current:
            self._changes.append((now, proposed - current))
            self.replicas = proposed
        return self.replicas

    def _up_limit(self, now: float, current: int) -> int:
        limits = []
        for policy in self.recipe.behaviour.up.policies:
            start = current - sum(d for t, d in self._changes if d > 0 and t > now - policy.period_s)
            step = policy.value if policy.kind == "pods" else math.ceil(start * policy.value / 100)
            limits.append(start + step)
        return max(limits)

    def _down_limit(self, now: float, current: int) -> int:
        limits = []
        for policy in self.recipe.behaviour.down.policies:
            start = current - sum(d for t, d in self._changes if d < 0 and t > now - policy.period_s)
            step = policy.value if policy.kind == "pods" else int(start * policy.value / 100)
            limits.append(start - step)
        return min(limits)


# --- the pool ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Timing:
    load_s: float = 180.0  # from the autoscaler's decision to a backend serving (pod scheduled, model loaded)
    scrape_s: float = 15.0  # Prometheus's scrape interval (vLLM's, DCGM's and the gateway's /metrics)
    sync_s: float = 15.0  # the HPA controller's sync period
    control_interval_s: float = 2.0  # the gateway's control tick
    util_sample_s: float = 1.0  # the period one GPU utilisation reading covers
    min_replicas: int = 1
    max_replicas: int = 8  # deploy/k8s/vllm-autoscaling's maxReplicas
    settle_s: float = 300.0  # after the demand ends, time for what is in flight to finish (not billed)


LOADING, SERVING, DRAINING, GONE = "loading", "serving", "draining", "gone"


@dataclass(slots=True)
class _Request:
    arrival: Arrival
    admitted: float = 0.0
    first_token: float | None = None
    finished: float | None = None
    tokens: int = 0
    backend: int = -1


class _Backend:
    """One vLLM server: its engine, its life, and (through the gateway) its limiter, window and controller."""

    def __init__(self, index: int, engine: Engine, created: float, ready_at: float, window_s: float) -> None:
        self.index = index
        self.engine = engine
        self.created, self.ready_at = created, ready_at
        self.gone_at: float | None = None
        self.state = LOADING
        self.step_pending = False
        self.step_end = 0.0
        self.busy_pushed = 0.0  # seconds of steps started, the running one in full
        self.requests: dict[int, _Request] = {}  # engine sequence id -> request
        # the gateway's view of it
        self.limit = 1
        self.inflight = 0
        self.peak = 0
        self.window = SlidingWindow(window_s)
        self.control: UpstreamControl | None = None
        self.footprint: Footprint | None = None
        self.saturated = False
        self.last_chosen = -1

    def busy_until(self, t: float) -> float:
        """Seconds the engine has spent inside steps up to ``t`` (``t`` at or after the last step's start)."""
        return self.busy_pushed - (max(0.0, self.step_end - t) if self.step_pending else 0.0)


@dataclass
class Result:
    """What one recipe did over the run."""

    recipe: str
    backend_minutes: float
    requests: int
    good: int  # within the objectives
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    scale_events: int
    direction_changes: int
    max_backends: int
    timeline: list[tuple[float, int, int, float | None]] = field(default_factory=list)  # (t, asked, serving, metric)
    ttft_by_minute: list[tuple[float, float | None]] = field(default_factory=list)  # (minute start, p99 TTFT)

    @property
    def goodput(self) -> float:
        """Share of the requests that met the objectives."""
        return self.good / self.requests if self.requests else 0.0

    @property
    def flapping(self) -> bool:
        """One way up and one way down is what the ramp asks for; any further reversal is a flap."""
        return self.direction_changes > 1


def direction_changes(changes: list[int]) -> int:
    signs = [1 if d > 0 else -1 for d in changes if d]
    return sum(1 for a, b in itertools.pairwise(signs) if a != b)


class Pool:
    """Runs one recipe over ``demand`` on virtual time: ``Pool(...).run()``."""

    def __init__(
        self,
        recipe: Recipe,
        profile: Profile,
        demand: list[Arrival],
        duration_s: float,
        *,
        config: AimdConfig | None = None,
        timing: Timing | None = None,
        seed: int = 1,
    ) -> None:
        self.recipe, self.profile = recipe, profile
        self.config = config or AimdConfig()
        self.timing = timing or Timing()
        self.demand, self.duration_s, self.seed = demand, duration_s, seed
        fields = Settings.model_fields
        self.signal = CapacitySignal(
            fields["target_utilisation"].default, fields["scale_down_after_s"].default, self.config.window_s
        )
        self.initial_limit: int = fields["initial_limit"].default
        self.hpa = Hpa(recipe, self.timing.min_replicas, self.timing.min_replicas, self.timing.max_replicas)
        self.backends: list[_Backend] = []
        self.queue: deque[_Request] = deque()
        self.requests: list[_Request] = []
        self.now = 0.0
        self._events: list[tuple[float, int, int, int]] = []  # (at, seq, kind, payload)
        self._seq = itertools.count()
        self._rr = 0
        self._chosen = itertools.count()
        self._desired: int | None = None  # the signal's last figure, as the gateway exports it
        self._scraped: float | None = None  # the recipe's metric summed over the pool at the last scrape
        self._util_mark: dict[int, float] = {}  # busy seconds at the start of each backend's util sample
        self._pending: dict[int, StepResult] = {}  # each stepping backend's step, delivered at its end
        self.timeline: list[tuple[float, int, int, float | None]] = []
        self.changes: list[int] = []

    # --- the driver -------------------------------------------------------------------------------------
    _ARRIVE, _STEP, _TICK, _SCRAPE, _MARK, _SYNC, _READY = range(7)

    def run(self) -> Result:
        for _ in range(self.timing.min_replicas):
            self._add_backend(ready=True)
        if self.demand:
            self._push(self.demand[0].at, self._ARRIVE, 0)
        timing = self.timing
        if self.recipe.through_gateway:
            self._push(timing.control_interval_s, self._TICK, 0)
        self._push(timing.scrape_s - timing.util_sample_s, self._MARK, 0)
        self._push(timing.scrape_s, self._SCRAPE, 0)
        self._push(timing.scrape_s + 1.0, self._SYNC, 0)
        end = self.duration_s + timing.settle_s
        handlers = {
            self._ARRIVE: self._arrive,
            self._STEP: self._deliver,
            self._TICK: self._tick,
            self._SCRAPE: self._scrape,
            self._MARK: self._mark,
            self._SYNC: self._sync,
            self._READY: self._ready,
        }
        while self._events and self._events[0][0] <= end:
            at, _, kind, payload = heapq.heappop(self._events)
            self.now = at
            handlers[kind](payload)
        return self._outcome()

    def _push(self, at: float, kind: int, payload: int) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, payload))

    # --- backends coming and going ----------------------------------------------------------------------
    def _add_backend(self, ready: bool = False) -> None:
        index = len(self.backends)
        engine = Engine(self.profile, seed=self.seed * 1009 + index)
        ready_at = self.now if ready else self.now + self.timing.load_s
        backend = _Backend(index, engine, self.now, ready_at, self.config.window_s)
        self.backends.append(backend)
        if ready:
            self._ready(index)
        else:
            self._push(ready_at, self._READY, index)

    def _ready(self, index: int) -> None:
        backend = self.backends[index]
        if backend.state != LOADING:
            return  # removed while loading
        backend.state = SERVING
        if self.recipe.through_gateway:
            # as gateway.server.feedback.membership: a joining upstream starts at its siblings' median limit
            siblings = sorted(b.limit for b in self.backends if b.state == SERVING and b is not backend)
            start = StartPoint(limit=siblings[(len(siblings) - 1) // 2]) if siblings else None
            initial = start.limit if start is not None else self.initial_limit
            backend.control = UpstreamControl(f"b{index}", self.config, initial_limit=initial, start=start)
            backend.limit = backend.control.limit
            self._dispatch()

    def _scale_to(self, replicas: int) -> None:
        alive = [b for b in self.backends if b.state in (LOADING, SERVING)]
        for _ in range(replicas - len(alive)):
            self._add_backend()
        for backend in sorted(alive, key=lambda b: b.index, reverse=True)[: max(0, len(alive) - replicas)]:
            if backend.state == LOADING:
                backend.state, backend.gone_at = GONE, self.now
            else:
                backend.state = DRAINING
                self._maybe_gone(backend)

    def _maybe_gone(self, backend: _Backend) -> None:
        if backend.state == DRAINING and not backend.requests:
            backend.state, backend.gone_at = GONE, self.now

    # --- requests ---------------------------------------------------------------------------------------
    def _arrive(self, i: int) -> None:
        if i + 1 < len(self.demand):
            self._push(self.demand[i + 1].at, self._ARRIVE, i + 1)
        request = _Request(self.demand[i])
        self.requests.append(request)
        if self.recipe.through_gateway:
            self.queue.append(request)
            self._dispatch()
            return
        serving = [b for b in self.backends if b.state == SERVING]
        backend = serving[self._rr % len(serving)]
        self._rr += 1
        self._submit(backend, request)

    def _dispatch(self) -> None:
        """The gateway's queue: the head goes to the serving upstream with the most free permits (ties: the one
        chosen least recently), while one has room."""
        while self.queue:
            open_ = [b for b in self.backends if b.state == SERVING and b.inflight < b.limit]
            if not open_:
                return
            backend = max(open_, key=lambda b: (b.limit - b.inflight, -b.last_chosen))
            backend.last_chosen = next(self._chosen)
            request = self.queue.popleft()
            backend.inflight += 1
            backend.peak = max(backend.peak, backend.inflight)
            self._submit(backend, request)

    def _submit(self, backend: _Backend, request: _Request) -> None:
        request.admitted, request.backend = self.now, backend.index
        sid = backend.engine.submit(request.arrival.prompt, request.arrival.output, self.now, ignore_eos=True)
        backend.requests[sid] = request
        self._kick(backend)

    def _kick(self, backend: _Backend) -> None:
        if backend.step_pending or not backend.engine.has_work:
            return
        at = backend.engine.next_step_at(self.now)
        if at is None:
            return
        result = backend.engine.step(at)
        if result is None:
            return
        backend.step_pending = True
        backend.step_end = result.end
        backend.busy_pushed += result.end - result.start
        self._pending[backend.index] = result
        self._push(result.end, self._STEP, backend.index)

    def _deliver(self, index: int) -> None:
        backend = self.backends[index]
        result = self._pending.pop(index)
        backend.step_pending = False
        streamed = 0
        for sid in result.tokens:
            request = backend.requests.get(sid)
            if request is None:
                continue
            if request.first_token is None:
                request.first_token = self.now
            request.tokens += 1
            streamed += 1
        if self.recipe.through_gateway and streamed:
            backend.window.add_tokens(self.now, streamed)
        for sid in result.finished:
            request = backend.requests.pop(sid, None)
            backend.engine.forget(sid)
            if request is not None:
                self._end(backend, request)
        self._kick(backend)
        self._maybe_gone(backend)

    def _end(self, backend: _Backend, request: _Request) -> None:
        request.finished = self.now
        if not self.recipe.through_gateway:
            return
        backend.inflight -= 1
        backend.window.add(self._sample(request))
        self._dispatch()

    def _sample(self, request: _Request) -> RequestSample:
        return RequestSample(
            arrived=request.arrival.at,
            admitted=request.admitted,
            finished=request.finished if request.finished is not None else self.now,
            first_token=request.first_token,
            prompt_tokens=request.arrival.prompt,
            output_tokens=request.tokens,
            outcome=Outcome.OK,
        )

    # --- the gateway's control tick -------------------------------------------------------------------
    def _tick(self, _: int) -> None:
        self._push(self.now + self.timing.control_interval_s, self._TICK, 0)
        readings: list[Reading] = []
        for backend in self.backends:
            if backend.control is None or backend.state not in (SERVING, DRAINING):
                continue
            engine = backend.engine
            headroom = Headroom(
                kv_usage=engine.kv_usage,
                backend_running=engine.num_running,
                backend_waiting=engine.num_waiting,
                preemptions_total=float(engine.num_preemptions),
                generation_tokens_total=float(engine.generation_tokens_total),
                generation_tokens_live=True,
                backend_at=self.now,
            )
            queued = len(self.queue) if backend.state == SERVING else 0
            state = LimiterState(backend.limit, backend.inflight, max(backend.peak, backend.inflight), queued)
            backend.peak = backend.inflight
            backend.footprint = Footprint.update(backend.footprint, backend.window.samples(self.now))
            cap = None
            if backend.footprint is not None:
                cap = kv_cap(
                    self.profile.num_gpu_blocks * self.profile.block_size, self.profile.block_size, backend.footprint
                )
            decision = backend.control.tick(self.now, backend.window, state, headroom, hard_cap=cap)
            backend.saturated = state.queue_depth > 0 or state.peak_inflight >= max(state.limit, 1)
            backend.limit = decision.limit
            stats = backend.control.last_stats
            readings.append(
                Reading(
                    upstream=f"b{backend.index}",
                    model=MODEL,
                    saturated=backend.saturated,
                    goodput_requests_per_s=0.0 if stats is None else stats.ok / stats.span_s,
                    output_tokens_per_s=0.0 if stats is None else stats.output_tokens_per_s,
                    finished=tuple(s.finished for s in backend.window.samples(self.now)),
                    backlog=backend.inflight,
                    window_s=backend.window.horizon_s,
                )
            )
        self._dispatch()
        signals = self.signal.step(self.now, readings, {MODEL: len(self.queue)})
        self._desired = signals[0].desired if signals else None

    # --- Prometheus and the HPA -------------------------------------------------------------------------
    def _mark(self, _: int) -> None:
        self._push(self.now + self.timing.scrape_s, self._MARK, 0)
        self._util_mark = {b.index: b.busy_until(self.now) for b in self.backends if b.state == SERVING}

    def _scrape(self, _: int) -> None:
        self._push(self.now + self.timing.scrape_s, self._SCRAPE, 0)
        metric = self.recipe.metric
        live = [b for b in self.backends if b.state in (SERVING, DRAINING)]
        if metric == "signal":
            self._scraped = None if self._desired is None else float(self._desired)
        elif metric == "waiting":  # a draining pod leaves the Service, and the scrape's targets with it
            self._scraped = float(sum(b.engine.num_waiting for b in live if b.state == SERVING))
        else:
            span = self.timing.util_sample_s
            util = 0.0
            for b in live:
                if b.state == SERVING and b.index in self._util_mark:
                    util += 100.0 * min(1.0, (b.busy_until(self.now) - self._util_mark[b.index]) / span)
            self._scraped = util

    def _sync(self, _: int) -> None:
        self._push(self.now + self.timing.sync_s, self._SYNC, 0)
        if self.now > self.duration_s:
            return
        before = self.hpa.replicas
        after = self.hpa.sync(self.now, self._scraped)
        if after != before:
            self.changes.append(after - before)
            self._scale_to(after)
        serving = sum(1 for b in self.backends if b.state == SERVING)
        self.timeline.append((self.now, after, serving, self._scraped))

    # --- the outcome ------------------------------------------------------------------------------------
    def _outcome(self) -> Result:
        end = self.duration_s
        minutes = sum(min(end, b.gone_at if b.gone_at is not None else end) - b.created for b in self.backends) / 60
        slo_ttft, slo_tpot = self.config.ttft_p99_slo_s, self.config.tpot_p99_slo_s
        ttfts: list[float] = []
        tpots: list[float] = []
        good = 0
        for request in self.requests:
            if request.first_token is None or request.finished is None:
                ttfts.append(math.inf)
                continue
            ttft = request.first_token - request.arrival.at  # as the client sees it: any queue counts
            ttfts.append(ttft)
            tpot = (request.finished - request.first_token) / max(request.tokens - 1, 1)
            tpots.append(tpot)
            if (slo_ttft is None or ttft <= slo_ttft) and (slo_tpot is None or tpot <= slo_tpot):
                good += 1
        by_minute: list[tuple[float, float | None]] = []
        buckets: dict[int, list[float]] = {}
        for request, ttft in zip(self.requests, ttfts, strict=True):
            buckets.setdefault(int(request.arrival.at // 60), []).append(ttft)
        for minute in range(math.ceil(end / 60)):
            values = buckets.get(minute, [])
            by_minute.append((minute * 60.0, percentile(values, 99) if values else None))
        return Result(
            recipe=self.recipe.name,
            backend_minutes=minutes,
            requests=len(self.requests),
            good=good,
            ttft_p99_s=percentile(ttfts, 99) if ttfts else None,
            tpot_p99_s=percentile(tpots, 99) if tpots else None,
            scale_events=len(self.changes),
            direction_changes=direction_changes(self.changes),
            max_backends=max((asked for _, asked, _, _ in self.timeline), default=self.timing.min_replicas),
            timeline=self.timeline,
            ttft_by_minute=by_minute,
        )


def run_recipe(
    recipe: Recipe,
    profile: Profile,
    ramp: Ramp,
    workload: Workload,
    *,
    config: AimdConfig | None = None,
    timing: Timing | None = None,
    seed: int = 1,
) -> Result:
    """One recipe over the ramp's arrivals (the same for every recipe with the same seed)."""
    demand = arrivals(ramp, workload, seed)
    return Pool(recipe, profile, demand, ramp.duration_s, config=config, timing=timing, seed=seed).run()


def one_backend_capacity(profile_name: str, workload: Workload, config: AimdConfig, seed: int = 1) -> float:
    """Requests/s one backend serves at its sweet spot under ``workload``: the oracle's (every static limit
    simulated, :func:`testbed.scenarios.evaluate.oracle`) goodput there over the mean answer's tokens."""
    found = oracle(profile_name, Conditions(clients=(64,), workload=workload), config, seed)
    point = found.at(found.sweet_spot)
    assert point is not None
    return point.goodput / (sum(workload.output) / 2)
