"""A discrete-event harness on virtual time: closed-loop clients -> gateway-like queues and limiters ->
the simulator's pure engine, with the controller ticking as it does in the gateway.

It exists so the controller can be judged on *outcomes* (where the limit settles, the goodput it
gets) in seconds of CPU, deterministically, against the same continuous-batching engine the HTTP
simulator runs. Each gateway here is fed exactly as the real proxy feeds its window: a streamed
request's output tokens credited as each engine step delivers them, a non-streamed one registered while
in flight and its tokens visible only in its :class:`RequestSample` when it ends, and the limiter's
numbers (limit, in-flight, peak in-flight since the last tick, queue depth) at each tick. The backend's
``/metrics`` (including its generated-token counter, live per step as vLLM's, or absent) are "scraped"
every ``scrape_interval_s`` and can be frozen (stale). The trace keeps what the backend really did (a
non-streamed request's first token too), so goodput is judged on the same facts for every kind of traffic.

Used by the scenario tests, ``bench/controller_scenarios.py`` and anything else that wants to watch
the controller work without a network. It imports :mod:`gateway.sim`, so the gateway itself never
imports this module.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gateway.control.algorithm import LimitAlgorithm, RequestObserver
from gateway.control.config import AimdConfig, StartPoint
from gateway.control.controller import UpstreamControl
from gateway.control.knee_search.capacity import Footprint, kv_cap
from gateway.control.knee_search.kv_estimate import PromptEstimates, admission_cap
from gateway.control.observation import Headroom, LimiterState
from gateway.control.share import Entry, Peers
from gateway.control.window import Outcome, RequestSample, SlidingWindow
from gateway.server.admission.fair_queue import Discipline, FairQueue
from gateway.server.admission.prompt_size import estimated_kv_tokens
from gateway.server.admission.reserve import Reserve
from gateway.server.admission.tenants import Tenant
from gateway.server.routes.validation import ChatRequest
from gateway.settings import Settings
from gateway.sim.engine import Engine, InjectedError, StepResult
from gateway.sim.profiles import Profile
from gateway.sim.text import CHAT_TOKENS_PER_MESSAGE, CHAT_TOKENS_REPLY, text_of_tokens

RETRY_AFTER_ERROR_S = 1.0  # a client whose request failed tries again after this (as an SDK backs off)
# The modes in which a scrape reads the backend, and the KV usage each reports (None: the true one).
LIVE_MODES: dict[str, float | None] = {"live": None, "kv_zero": 0.0, "kv_one": 1.0}


@dataclass(frozen=True, slots=True)
class Workload:
    """Request sizes, uniform in [lo, hi] (tokens), each client's pause between requests, and the share of
    requests that are streamed (the rest get their answer whole)."""

    prompt: tuple[int, int] = (512, 512)
    output: tuple[int, int] = (512, 512)
    think_s: float = 0.0
    streamed: float = 1.0

    def draw(self, rng: random.Random) -> tuple[int, int]:
        return rng.randint(*self.prompt), rng.randint(*self.output)

    def draw_streamed(self, rng: random.Random) -> bool:
        """Drawn only for a mix: all-streamed and all-whole runs keep their random sequence."""
        if self.streamed >= 1.0 or self.streamed <= 0.0:
            return self.streamed >= 1.0
        return rng.random() < self.streamed


@dataclass(frozen=True, slots=True)
class Conditions:
    """What the world looks like during one phase (the unit an oracle is computed for)."""

    clients: tuple[int, ...]  # closed-loop clients per gateway
    workload: Workload = Workload()
    speed_factor: float = 1.0  # the backend's step times x this (2.0: twice as slow)
    error_rate: float = 0.0  # share of submissions the backend fails at once
    # What the backend's /metrics say: "live"; "frozen" (stale: the last scrape stays, or ``frozen_headroom``);
    # "missing" (the scrape answers nothing: no KV, queue or counter figures, no published cache size; "none"
    # is the same); "kv_zero" / "kv_one" (KV usage always reads 0.0 / 1.0, everything else true).
    metrics: str = "live"
    frozen_headroom: Headroom | None = None  # what a frozen /metrics keeps reporting, if given
    # The hop from the gateway to the engine: an admitted request reaches the engine after a delay
    # drawn from [0, hop_s]. Over HTTP it lands at any moment of an engine step and waits in the
    # backend's queue for the next one, which is what a scrape of the waiting gauge then finds (vLLM
    # reports it per step). With 0 it is submitted at the step end that freed its permit, and the
    # engine admits it before anyone could look.
    hop_s: float = 0.0
    # Whether the backend's /metrics carry a generated-token counter that moves per engine step (vLLM's
    # ``generation_tokens_total``); without one (llama-server counts when requests end) the gateway has
    # only its own count.
    backend_counter: bool = True


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    weight: float = 1.0
    cls: int = 0  # priority class, 0 the highest


@dataclass(frozen=True)
class Tenancy:
    """Clients split between tenants, queued by the gateway's own :class:`FairQueue` instead of one FIFO.

    ``assign(client)`` gives a client's tenant index; by default clients go round robin."""

    tenants: tuple[TenantSpec, ...]
    discipline: Discipline = "fair"
    starvation_after: int = 20
    assign: Callable[[int], int] | None = None
    reserve: float = Settings.model_fields["tenant_reserve"].default  # the gateway's (fair discipline only)

    def of(self, client: int) -> TenantSpec:
        index = client % len(self.tenants) if self.assign is None else self.assign(client)
        return self.tenants[index]

    @property
    def classes(self) -> int:
        return max(spec.cls for spec in self.tenants) + 1


@dataclass(slots=True)
class Finished:
    """One request as the client saw it (times in virtual seconds)."""

    gateway: int
    sample: RequestSample
    tenant: str | None = None


@dataclass(slots=True)
class Tick:
    gateway: int
    now: float
    limit: int
    inflight: int
    queue: int
    action: str
    reason: str


@dataclass
class Trace:
    """Everything a run produced, for the assertions and the report."""

    finished: list[Finished] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    kv_usage: list[tuple[float, float]] = field(default_factory=list)
    waiting: list[tuple[float, int]] = field(default_factory=list)  # the backend's queue at each scrape
    preemptions: list[tuple[float, int]] = field(default_factory=list)  # (time, cumulative)

    def limits(self, gateway: int = 0) -> list[tuple[float, int]]:
        return [(t.now, t.limit) for t in self.ticks if t.gateway == gateway]

    def preemptions_between(self, start: float, end: float) -> int:
        before = max((n for t, n in self.preemptions if t <= start), default=0)
        after = max((n for t, n in self.preemptions if t <= end), default=0)
        return after - before


@dataclass(slots=True)
class _Request:
    gateway: int
    client: int
    prompt: int
    output: int
    arrived: float
    admitted: float = 0.0
    first_token: float | None = None
    tokens: int = 0
    streamed: bool = True
    open_key: int | None = None  # registered in flight with the gateway's window (non-streamed)
    inflight_at_admit: int = 0
    tenant: Tenant | None = None
    gone: bool = False  # what the fair queue asks of its items; nobody leaves a queue here


class _Gateway:
    """A gateway's admission path for one upstream: the queue (one FIFO, or the gateway's fair queue and
    reserve with tenants), limiter, window, controller."""

    def __init__(
        self, index: int, limit: int, window_s: float, control: UpstreamControl | None, tenancy: Tenancy | None = None
    ) -> None:
        self.index = index
        self.limit = limit
        self.inflight = 0
        self.peak = 0
        self.queue: deque[_Request] = deque()
        self.window = SlidingWindow(window_s)
        self.control = control
        self.fair: FairQueue[_Request] | None = None
        self.holders: dict[str, Tenant] = {}  # each tenant's counts at this gateway, as the gateway keeps them
        self.reserve = Reserve(0.0)
        self.admitted_over = 0  # admissions that took in-flight above the limit (the rules allow none)
        self.footprint: Footprint | None = None  # the last known, as ``Upstream.request_footprint`` keeps it
        self.estimates = PromptEstimates()  # the admitted requests' KV, estimated from their text (``Upstream``)
        # The built-in controller takes the KV cap from the estimates before each admission, as the gateway
        # holds it (``Upstream.admitting``); the baselines and static limits never read a hard cap.
        self.holds_kv_cap = False
        if tenancy is not None:
            self.fair = FairQueue(
                tenancy.classes, discipline=tenancy.discipline, starvation_after=tenancy.starvation_after
            )
            self.reserve = Reserve(tenancy.reserve if tenancy.discipline == "fair" else 0.0)

    def holder(self, spec: TenantSpec) -> Tenant:
        found = self.holders.get(spec.name)
        if found is None:
            found = self.holders[spec.name] = Tenant(
                spec.name, weight=spec.weight, priority=spec.cls, max_priority=spec.cls
            )
        return found

    def queued(self) -> int:
        return len(self.queue) if self.fair is None else len(self.fair)

    def room(self, tenant: Tenant) -> bool:
        return self.reserve.may_take(tenant, inflight=self.inflight, limit=self.limit)

    def push(self, request: _Request) -> None:
        if self.fair is None:
            self.queue.append(request)
        else:
            tenant = request.tenant
            assert tenant is not None
            self.fair.push(request, flow=tenant, weight=tenant.weight, cls=tenant.priority)
            self.reserve.join(tenant)
            tenant.queued += 1

    def pop(self) -> _Request | None:
        if self.fair is None:
            return self.queue.popleft() if self.queue else None
        request = self.fair.pop(self.room, _anywhere)  # type: ignore[arg-type]
        if request is not None and request.tenant is not None:
            request.tenant.queued -= 1  # it is admitted at once: it stays active throughout
        return request


def _anywhere(_request: _Request) -> bool:
    return True


class Harness:
    """One backend engine, ``len(conditions.clients)`` gateways in front of it, virtual time.

    With ``static_limit`` set, gateways hold that limit (the oracle's static runs); otherwise each
    runs an :class:`UpstreamControl` built from ``config``, stepping ``algorithm()`` instead of the
    controller when that is given (the comparison baselines). An algorithm that is also a
    :class:`RequestObserver` hears of every request as it ends, and its answer is applied at once. Each
    gateway's hard cap is the KV cache's, worked out as the gateway does from the published cache size and
    its recent requests (before any has finished, from the admitted requests' sizes estimated from their
    bodies, and then before each admission too: ``_admitting``), unless ``hard_cap`` fixes one.
    """

    def __init__(
        self,
        profile: Profile,
        config: AimdConfig,
        *,
        gateways: int = 1,
        seed: int = 0,
        initial_limit: int = 8,
        start: StartPoint | None = None,
        static_limit: int | None = None,
        control_interval_s: float = 2.0,
        scrape_interval_s: float = 2.0,
        hard_cap: int | None = None,
        algorithm: Callable[[], LimitAlgorithm] | None = None,
        shared: bool = False,
        count_at_end: bool = False,
        tenancy: Tenancy | None = None,
    ) -> None:
        self.profile = profile
        # Meter every token when it becomes visible to the gateway (a whole answer's at its end), as the
        # gateway did before it spread them: only for showing that the checks catch that.
        self.count_at_end = count_at_end
        self.config = config
        self.engine = Engine(profile, seed=seed)
        self.rng = random.Random(seed * 7919 + 17)
        self.control_interval_s = control_interval_s
        self.scrape_interval_s = scrape_interval_s
        self.hard_cap = hard_cap
        self.tenancy = tenancy
        self.gateways: list[_Gateway] = []
        for g in range(gateways):
            control = None
            if static_limit is None:
                control = UpstreamControl(
                    f"gw{g}",
                    config,
                    initial_limit=initial_limit,
                    start=start,
                    algorithm=None if algorithm is None else algorithm(),
                )
            limit = static_limit if static_limit is not None else control.limit  # type: ignore[union-attr]
            self.gateways.append(_Gateway(g, limit, config.window_s, control, tenancy))
            self.gateways[-1].holds_kv_cap = control is not None and algorithm is None
        self.trace = Trace()
        self.now = 0.0
        self.conditions: Conditions | None = None
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self._by_sid: dict[int, _Request] = {}
        self._active: list[set[int]] = [set() for _ in range(gateways)]  # clients that keep sending
        self._busy: list[set[int]] = [set() for _ in range(gateways)]  # clients with a request out
        self._step_pending = False
        self._headroom = Headroom()
        self._kv_published: tuple[int, int] | None = None  # (KV capacity in tokens, block size), once scraped
        # The replicas' shared state (what Redis holds between real gateways), one entry per gateway.
        self.board: dict[int, Entry] | None = {} if shared else None
        self._initial_limit, self._start, self._algorithm = initial_limit, start, algorithm
        self.gone: set[int] = set()
        for g in range(gateways):
            self._push(control_interval_s * (1 + g / max(gateways, 1) / 7), "tick", g)
        self._push(0.0, "scrape", None)

    # --- the public driver ---------------------------------------------------------------------
    def run_phase(self, conditions: Conditions, duration_s: float) -> None:
        """Apply ``conditions`` now and simulate ``duration_s`` seconds."""
        if len(conditions.clients) != len(self.gateways):
            raise ValueError("conditions.clients needs one count per gateway")
        self.conditions = conditions
        self.engine.set_scenario(speed_factor=conditions.speed_factor, error_rate=conditions.error_rate)
        for g, count in enumerate(conditions.clients):
            wanted = set(range(count))
            self._active[g] = wanted
            for client in sorted(wanted - self._busy[g]):
                self._push(self.now, "arrive", (g, client))
        if conditions.metrics == "frozen" and conditions.frozen_headroom is not None:
            self._headroom = conditions.frozen_headroom
        self._run_until(self.now + duration_s)

    # --- the event loop ------------------------------------------------------------------------
    def _push(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, payload))

    def _run_until(self, end: float) -> None:
        while self._events and self._events[0][0] <= end:
            at, _, kind, payload = heapq.heappop(self._events)
            self.now = max(self.now, at)
            if kind == "step":
                self._deliver(payload)  # type: ignore[arg-type]
            elif kind == "arrive":
                self._arrive(*payload)  # type: ignore[misc]
            elif kind == "tick":
                self._tick(payload)  # type: ignore[arg-type]
            elif kind == "submit":
                self._submit(payload)  # type: ignore[arg-type]
            elif kind == "scrape":
                self._scrape()
            self._kick()
        self.now = end

    def open_requests(self) -> list[Finished]:
        """Requests still in flight, as samples ending now (for goodput windows that end mid-request)."""
        out = []
        for request in self._by_sid.values():
            sample = RequestSample(
                arrived=request.arrived,
                admitted=request.admitted,
                finished=self.now,
                first_token=request.first_token,
                prompt_tokens=request.prompt,
                output_tokens=request.tokens,
                outcome=Outcome.OK,
            )
            out.append(Finished(request.gateway, sample, None if request.tenant is None else request.tenant.name))
        return out

    def _kick(self) -> None:
        """Start the engine's next step if it is idle and has work; its results land at its end."""
        if self._step_pending or not self.engine.has_work:
            return
        at = self.engine.next_step_at(self.now)
        if at is None:
            return
        result = self.engine.step(at)
        if result is None:
            return
        self._step_pending = True
        self._push(result.end, "step", result)

    # --- clients and the gateway's admission ---------------------------------------------------
    def _arrive(self, g: int, client: int) -> None:
        if client not in self._active[g] or client in self._busy[g]:
            return
        assert self.conditions is not None
        prompt, output = self.conditions.workload.draw(self.rng)
        streamed = self.conditions.workload.draw_streamed(self.rng)
        self._busy[g].add(client)
        gw = self.gateways[g]
        request = _Request(g, client, prompt, output, arrived=self.now, streamed=streamed)
        self._admitting(gw, request)
        if self.tenancy is not None:
            request.tenant = gw.holder(self.tenancy.of(client))
            if not request.tenant.queued and gw.room(request.tenant):  # as the gateway's fast path
                self._admit(gw, request)
                return
        gw.push(request)
        self._dispatch(gw)

    def _admitting(self, gw: _Gateway, request: _Request) -> None:
        """Before a request's admission, as the gateway's request path (``Upstream.admitting``): until a
        footprint is measured, its KV estimated from its body joins the admitted requests', and the limit comes
        down to what the published cache holds of them. The body is the one a client would send the
        simulator for this prompt: one user message whose text the simulator counts as the request's prompt
        tokens (``gateway.sim.text``), and ``max_tokens`` its answer's length (as a benchmark that sets
        ``ignore_eos``), read by the gateway's own estimate."""
        if gw.footprint is not None:
            return
        text = text_of_tokens(max(request.prompt - CHAT_TOKENS_PER_MESSAGE - CHAT_TOKENS_REPLY, 1))
        body = ChatRequest(model="sim", messages=[{"role": "user", "content": text}], max_tokens=request.output)
        tokens = estimated_kv_tokens(body)
        if tokens is None:
            return
        gw.estimates.note(tokens)
        if gw.holds_kv_cap and self._kv_published is not None:
            capacity, block = self._kv_published
            lowered = admission_cap(gw.limit, capacity, block, gw.estimates)
            if lowered is not None:
                gw.limit = lowered

    def _dispatch(self, gw: _Gateway) -> None:
        while gw.inflight < gw.limit:
            request = gw.pop()
            if request is None:
                break
            self._admit(gw, request)

    def _admit(self, gw: _Gateway, request: _Request) -> None:
        request.admitted = self.now
        if not request.streamed:
            request.open_key = gw.window.opened(self.now)
        gw.inflight += 1
        if gw.inflight > gw.limit:
            gw.admitted_over += 1
        if request.tenant is not None:
            gw.reserve.join(request.tenant)
            request.tenant.inflight += 1
        request.inflight_at_admit = gw.inflight
        gw.peak = max(gw.peak, gw.inflight)
        hop = self.conditions.hop_s if self.conditions is not None else 0.0
        if hop > 0:  # drawn only with a hop: runs without one keep their random sequence
            self._push(self.now + self.rng.uniform(0.0, hop), "submit", request)
        else:
            self._submit(request)

    def _submit(self, request: _Request) -> None:
        try:
            sid = self.engine.submit(request.prompt, request.output, self.now, ignore_eos=True)
        except InjectedError:
            self._end(request, Outcome.UPSTREAM_ERROR)
            return
        self._by_sid[sid] = request

    def _end(self, request: _Request, outcome: Outcome) -> None:
        gw = self.gateways[request.gateway]
        gw.inflight -= 1
        if request.tenant is not None:
            request.tenant.inflight -= 1
            gw.reserve.settle(request.tenant)
        sample = RequestSample(
            arrived=request.arrived,
            admitted=request.admitted,
            finished=self.now,
            first_token=request.first_token,
            prompt_tokens=request.prompt,
            output_tokens=request.tokens,
            outcome=outcome,
        )
        # What the gateway sees of a whole answer: no first token, every token at the end.
        seen = sample if request.streamed else replace(sample, first_token=None, streamed=False)
        gw.window.add(seen)
        if request.open_key is not None:
            gw.window.closed(request.open_key)
        self.trace.finished.append(
            Finished(request.gateway, sample, None if request.tenant is None else request.tenant.name)
        )
        if gw.control is not None and isinstance(gw.control.algorithm, RequestObserver):
            gw.limit = gw.control.algorithm.on_request(self.now, seen, request.inflight_at_admit, gw.inflight)
        self._busy[request.gateway].discard(request.client)
        assert self.conditions is not None
        pause = self.conditions.workload.think_s if outcome is Outcome.OK else RETRY_AFTER_ERROR_S
        self._push(self.now + pause, "arrive", (request.gateway, request.client))
        self._dispatch(gw)

    def _deliver(self, result: StepResult) -> None:
        self._step_pending = False
        credited: dict[int, int] = {}
        for sid in result.tokens:
            request = self._by_sid.get(sid)
            if request is None:
                continue
            if request.first_token is None:
                request.first_token = self.now
            request.tokens += 1
            if request.streamed:
                credited[request.gateway] = credited.get(request.gateway, 0) + 1
        for g, count in credited.items():
            gw = self.gateways[g]
            gw.window.add_tokens(self.now, count)
        for sid in result.finished:
            request = self._by_sid.pop(sid, None)
            self.engine.forget(sid)
            if request is not None:
                self._end(request, Outcome.OK)
        if result.preempted:
            self.trace.preemptions.append((self.now, self.engine.num_preemptions))

    # --- observation and control ---------------------------------------------------------------
    def _scrape(self) -> None:
        self._push(self.now + self.scrape_interval_s, "scrape", None)
        engine = self.engine
        self.trace.kv_usage.append((self.now, engine.kv_usage))
        self.trace.waiting.append((self.now, engine.num_waiting))
        self._read_backend()

    def _read_backend(self) -> None:
        engine = self.engine
        mode = self.conditions.metrics if self.conditions is not None else "live"
        counter = self.conditions is None or self.conditions.backend_counter
        if mode in LIVE_MODES:
            kv = LIVE_MODES[mode]
            self._headroom = Headroom(
                kv_usage=engine.kv_usage if kv is None else kv,
                backend_running=engine.num_running,
                backend_waiting=engine.num_waiting,
                preemptions_total=float(engine.num_preemptions),
                generation_tokens_total=float(engine.generation_tokens_total) if counter else None,
                generation_tokens_live=counter,
                backend_at=self.now,
            )
            profile = self.profile
            self._kv_published = (profile.num_gpu_blocks * profile.block_size, profile.block_size)
        elif mode in ("none", "missing"):
            self._headroom = Headroom()
            self._kv_published = None

    def _kv_cap(self, gw: _Gateway) -> int | None:
        """The gateway's hard cap from the KV cache, worked out as ``feedback.hard_cap.hard_cap`` does from what
        vLLM publishes (``vllm:cache_config_info``: the profile's blocks, not a shrunk pool's) and the
        gateway's recent requests, or their estimates while none has finished."""
        gw.footprint = Footprint.update(gw.footprint, gw.window.samples(self.now))
        footprint = gw.footprint if gw.footprint is not None else gw.estimates.footprint()
        if self._kv_published is None or footprint is None:
            return None
        capacity, block = self._kv_published
        return kv_cap(capacity, block, footprint)

    def _peers(self, g: int, gw: _Gateway) -> Peers | None:
        """Publish this gateway's demand and limit on the board, and read the others' back."""
        if self.board is None:
            return None
        me = self._publish(g, gw)
        return Peers.of([entry for other, entry in self.board.items() if other != g], self.now, me)

    def _publish(self, g: int, gw: _Gateway) -> Entry:
        entry = Entry(gw.inflight + gw.queued(), gw.limit, self.now, f"gw{g:03d}")
        if self.board is not None and g not in self.gone:
            self.board[g] = entry
        return entry

    def restart(self, g: int) -> None:
        """Gateway ``g`` starts afresh (a new pod, or one restarted): a new controller at the initial
        limit, nothing measured, nothing on the board until its first tick."""
        gw = self.gateways[g]
        gw.control = UpstreamControl(
            f"gw{g}",
            self.config,
            initial_limit=self._initial_limit,
            start=self._start,
            algorithm=None if self._algorithm is None else self._algorithm(),
        )
        gw.limit = gw.control.limit
        gw.window = SlidingWindow(self.config.window_s)
        gw.footprint = None
        gw.estimates = PromptEstimates()
        gw.holds_kv_cap = self._algorithm is None
        self.gone.discard(g)
        if self.board is not None:
            self.board.pop(g, None)

    def leave(self, g: int) -> None:
        """Gateway ``g`` goes away: its entry leaves the board (in Redis: it expires)."""
        self.gone.add(g)
        if self.board is not None:
            self.board.pop(g, None)

    def _tick(self, g: int) -> None:
        self._push(self.now + self.control_interval_s, "tick", g)
        gw = self.gateways[g]
        limiter = LimiterState(gw.limit, gw.inflight, max(gw.peak, gw.inflight), gw.queued())
        gw.peak = gw.inflight
        action = reason = "static"
        if gw.control is not None and gw.control.accounting.counting_backend:
            self._read_backend()  # as the gateway does when it meters by the backend's counter
        if gw.control is not None:
            decision = gw.control.tick(
                self.now,
                gw.window,
                limiter,
                self._headroom,
                hard_cap=self.hard_cap if self.hard_cap is not None else self._kv_cap(gw),
                tokens_total=gw.window.tokens_total if self.count_at_end else None,
                peers=self._peers(g, gw),
            )
            action, reason = decision.action.value, decision.reason.value
            if decision.limit != gw.limit:
                gw.limit = decision.limit
                self._dispatch(gw)
            self._publish(g, gw)
        self.trace.ticks.append(Tick(g, self.now, gw.limit, gw.inflight, gw.queued(), action, reason))
