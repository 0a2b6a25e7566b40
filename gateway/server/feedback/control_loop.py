"""Runs the controllers of a live gateway: gathers each tick's inputs, applies the decisions.

Three loops feed and drive the pure controllers in ``gateway.control``:

* the backend scrape (every ``metrics_interval_s``): each upstream's own ``/metrics`` through the
  adapters in ``gateway.telemetry.backends`` (KV usage, waiting, preemptions, slots);
* the NVML read (every ``nvml_interval_s``, in a worker thread so the driver never blocks requests);
* the control tick (every ``control_interval_s``): window statistics + limiter numbers + headroom
  -> ``UpstreamControl.tick`` -> the new limit on the limiter, the queue re-dispatched, the decision
  counted in Prometheus and, when the limit moved, one structured log line.

None of this is on the request path, with one exception: an algorithm that is also a ``RequestObserver``
(``settings.algorithm`` names one; the built-in controller is not) hears of each request as it ends, through
the limiter's ``on_end``, and the limit it answers is applied before the freed permit is handed on, as the
scenario harness applies it. A failure in one loop, or in that hook, is logged and the gateway goes on; in
one upstream's tick (its exchange with the shared state, its controller), the other upstreams tick.

Whatever the algorithm, the limit it asks for is held within ``limit_min`` and ``limit_max`` (the limiter
holds no limit under 1), and the hard cap is computed and given to it in every observation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge

from gateway.control.algorithm import Decision, LimitAlgorithm, RequestObserver
from gateway.control.capacity_signal import CapacitySignal, ModelSignal, Reading
from gateway.control.config import AimdConfig, StartPoint
from gateway.control.controller import UpstreamControl
from gateway.control.observation import GpuHeadroom, Headroom, LimiterState
from gateway.control.share import Peers
from gateway.control.window import RequestSample
from gateway.server.feedback.algorithm_path import load_factory
from gateway.server.feedback.capacity_export import CapacitySeries, serving_model
from gateway.server.feedback.hard_cap import hard_cap, kv_size
from gateway.server.feedback.share_board import REJECT_REASONS, Bounds, ShareBoard, default_namespace
from gateway.server.feedback.start_points import load_start_points
from gateway.server.parts import Gateway
from gateway.server.upstream.pool import Upstream
from gateway.telemetry.backends import BackendScraper, BackendSnapshot
from gateway.telemetry.nvml import GpuSource, NvmlSource

log = logging.getLogger("sweetspot.controller")

NOT_SCRAPED = BackendSnapshot(kind="openai", error="not scraped yet")
# The `reason` label values of sweetspot_upstream_retries_total (upstream_client.py, routes/proxied.py).
RETRY_REASONS = ("stale_connection", "failover")


@dataclass
class ControlLoop:
    """The controllers and headroom sources of one gateway."""

    gateway: Gateway
    gpu_source: GpuSource
    scrapers: dict[str, BackendScraper] = field(default_factory=dict)
    controls: dict[str, UpstreamControl] = field(default_factory=dict)
    gpus: list[GpuHeadroom] = field(default_factory=list)
    gpus_at: float | None = None
    board: ShareBoard | None = None  # the replicas' shared state, when configured
    _failing: set[str] = field(default_factory=set)  # upstreams whose last control tick raised
    signal: CapacitySignal | None = None  # the capacity signal, computed on the control tick
    _saturated: dict[str, bool] = field(default_factory=dict)  # whether each upstream's limit bound last tick
    _capacity_series: CapacitySeries = field(default_factory=CapacitySeries)  # the capacity gauges' series set
    _config: AimdConfig | None = None  # the controllers' configuration, for an upstream that joins later
    _factory: Callable[[int], LimitAlgorithm] | None = None  # the `algorithm` setting's, when it names one
    _started: bool = False  # start() ran: an upstream that joins gets its scraper at once

    @classmethod
    def build(cls, gateway: Gateway, gpu_source: GpuSource | None = None) -> ControlLoop:
        settings = gateway.settings
        loop = cls(gateway, gpu_source or NvmlSource(settings.gpus))
        starts = load_start_points(settings.sweep_result, [upstream.name for upstream in gateway.pool])
        loop._config = AimdConfig.from_settings(settings)
        loop._factory = load_factory(settings.algorithm) if settings.algorithm and settings.control_enabled else None
        for objective, value in (("ttft_p99", settings.ttft_p99_slo_s), ("tpot_p99", settings.tpot_p99_slo_s)):
            _set_or_absent(gateway.metrics.objective, objective, value)
        for upstream in gateway.pool:
            loop.attach(upstream, starts.get(upstream.name))
        loop.signal = CapacitySignal(settings.target_utilisation, settings.scale_down_after_s, settings.window_s)
        if settings.share_redis_url and loop.controls:
            loop.board = loop.share_board(settings.share_redis_url)
        return loop

    def attach(self, upstream: Upstream, start: StartPoint | None = None, *, swept: bool = True) -> None:
        """Give ``upstream`` its controller and its series: at start for each upstream, later for one that joins
        (gateway.server.feedback.membership, which passes its siblings' limit as ``start`` with ``swept`` False:
        not a sweep's sweet spot, so not exported as one)."""
        gateway, settings = self.gateway, self.gateway.settings
        # Series that exist from the start at 0 (a counter nothing has incremented yet is a real 0),
        # so rate() over them is 0 rather than no data.
        for reason in RETRY_REASONS:
            gateway.metrics.upstream_retries.labels(upstream.name, reason)
        gateway.metrics.backend_scrape_errors.labels(upstream.name)
        gateway.metrics.controller_tick_errors.labels(upstream.name)
        # Where the gateway holds this upstream at start: its sweep result's sweet spot, else initial_limit.
        initial = self.bounded(start.limit if start is not None else settings.initial_limit)
        algorithm: LimitAlgorithm | None = self._factory(initial) if self._factory is not None else None
        if algorithm is not None:
            initial = self.bounded(algorithm.limit)  # another algorithm starts where it says
        upstream.limiter.set_limit(initial)
        # The built-in controller holds the hard cap; a baseline algorithm, or no control, reads none.
        upstream.holds_kv_cap = settings.control_enabled and algorithm is None
        upstream.kv_estimates_read = settings.control_enabled  # the tick reads them (hard_cap), nothing else
        if start is not None and swept:
            gateway.metrics.sweet_spot.labels(upstream.name).set(start.limit)
            if start.peak_tokens_per_s:
                gateway.metrics.sweep_peak_tokens_per_s.labels(upstream.name).set(start.peak_tokens_per_s)
        if settings.control_enabled:
            config = self._config or AimdConfig.from_settings(settings)
            control = UpstreamControl(upstream.name, config, initial_limit=initial, start=start, algorithm=algorithm)
            self.controls[upstream.name] = control
            if isinstance(control.algorithm, RequestObserver):
                upstream.limiter.on_end = self.request_listener(upstream, control.algorithm)
            if self.board is not None:
                for reason in REJECT_REASONS:
                    gateway.metrics.share_board_rejected.labels(upstream.name, reason)
        if self._started:
            self._start_scraper(upstream)

    def detach(self, name: str) -> None:
        """Forget an upstream that left the pool: its controller, scraper and per-upstream state."""
        self.controls.pop(name, None)
        self.scrapers.pop(name, None)
        self._failing.discard(name)
        self._saturated.pop(name, None)
        self._capacity_series.forget(name)

    def share_board(self, url: str, **kwargs: Any) -> ShareBoard:
        """The board of ``share_redis_url``: entries checked against this gateway's settings, rejections counted,
        keys in ``share_namespace`` (by default the hash of the upstreams and those settings)."""
        settings, metrics = self.gateway.settings, self.gateway.metrics
        namespace = settings.share_namespace or default_namespace(
            settings.upstreams, settings.limit_min, settings.limit_max, settings.max_queue
        )
        for upstream in self.controls:
            for reason in REJECT_REASONS:
                metrics.share_board_rejected.labels(upstream, reason)
        log.info("shared state in Redis", extra={"namespace": namespace})
        return ShareBoard(
            url,
            settings.share_ttl_s,
            bounds=Bounds.of(settings.limit_min, settings.limit_max, settings.max_queue),
            namespace=namespace,
            on_reject=lambda upstream, reason: metrics.share_board_rejected.labels(upstream, reason).inc(),
            **kwargs,
        )

    def bounded(self, limit: int) -> int:
        """``limit`` within the gateway's ``limit_min`` and ``limit_max``."""
        settings = self.gateway.settings
        return max(settings.limit_min, min(limit, settings.limit_max))

    def request_listener(
        self, upstream: Upstream, algorithm: RequestObserver
    ) -> Callable[[RequestSample, int, int], None]:
        """The limiter's ``on_end`` for an algorithm that learns from each request as it ends."""
        limiter, clock = upstream.limiter, self.gateway.clock

        def ended(sample: RequestSample, inflight_at_start: int, inflight: int) -> None:
            try:
                limit = self.bounded(algorithm.on_request(clock(), sample, inflight_at_start, inflight))
            except Exception:
                log.exception(
                    "the algorithm of %s failed on a request's end; its limit stays %d", upstream.name, limiter.limit
                )
                return
            if limit != limiter.limit:
                limiter.set_limit(limit)  # the queue is dispatched next, by the release that called this

        return ended

    def start(self) -> None:
        """Create the scrapers; needs the running event loop (they share the upstream session)."""
        self._started = True
        for upstream in self.gateway.pool:
            self._start_scraper(upstream)

    def _start_scraper(self, upstream: Upstream) -> None:
        settings = self.gateway.settings
        self.scrapers[upstream.name] = BackendScraper(
            upstream.url,
            kind=settings.backend,
            session=self.gateway.client.poll_session,
            api_key=settings.upstream_api_key,
            clock=self.gateway.clock,
            timeout_s=min(settings.metrics_interval_s, 5.0),
            read_health=False,  # the health poll (gateway.server.upstream.pool) reads /health already
        )
        self._bind_gauges(upstream)

    # --- gauges read at scrape time ---------------------------------------------------------------
    def _bind_gauges(self, upstream: Upstream) -> None:
        """What the backend does not report stays absent from /metrics (the readers return None)."""
        metrics, name, clock = self.gateway.metrics, upstream.name, self.gateway.clock
        scraper = self.scrapers[name]
        reading_since = clock()

        def age() -> float:
            value = scraper.latest.age(clock())
            return clock() - reading_since if value is None else value

        labels = (name,)
        metrics.backend_kv_usage.bind(labels, lambda: scraper.latest.kv_usage)
        metrics.backend_running.bind(labels, lambda: scraper.latest.running)
        metrics.backend_waiting.bind(labels, lambda: scraper.latest.waiting)
        metrics.backend_preemptions.bind(labels, lambda: scraper.latest.preemptions_total)
        metrics.backend_metrics_age.bind(labels, age)

    # --- loops --------------------------------------------------------------------------------------
    async def scrape(self, names: list[str] | None = None) -> None:
        """Scrape every upstream's backend, or those ``names``."""

        async def one(name: str, scraper: BackendScraper) -> None:
            snapshot = await scraper.scrape()
            upstream = self.gateway.pool.by_name.get(name)
            if upstream is None:
                return  # it left the pool meanwhile
            upstream.streams_keep_alive = scraper.kind == "vllm"
            upstream.any_name = scraper.kind == "llamacpp"  # llama-server answers any model name
            upstream.lora = snapshot.lora  # the last known while scrapes fail (LoRA affinity reads it)
            settings = self.gateway.settings
            upstream.kv_size = kv_size(snapshot, settings.kv_capacity_tokens)
            if snapshot.error is not None:
                self.gateway.metrics.backend_scrape_errors.labels(name).inc()
            else:  # a backend that reports no KV cache (llama-server) has no use for the estimates
                upstream.kv_estimates_read = settings.control_enabled and upstream.kv_size is not None

        await asyncio.gather(
            *(one(name, scraper) for name, scraper in self.scrapers.items() if names is None or name in names)
        )

    async def read_gpus(self) -> None:
        gpus = await asyncio.to_thread(self.gpu_source.read)
        self.gpus, self.gpus_at = gpus, self.gateway.clock()
        for gpu in gpus:
            label = str(gpu.index)
            self.gateway.metrics.gpu_memory_free_ratio.labels(label).set(gpu.memory_free_ratio)
            if gpu.utilization is not None:
                self.gateway.metrics.gpu_utilization_ratio.labels(label).set(gpu.utilization)

    async def control(self) -> None:
        """One tick of every upstream's controller. Each upstream's step stands alone: a shared-state exchange, a
        scrape or a controller that fails costs that upstream this tick (no peers: its own search; no step: its
        limit held), never the others' (counted in ``sweetspot_controller_tick_errors_total``)."""
        peers = await self.share() if self.board is not None else {}
        # A controller metering by the backend's token counter reads it fresh: its readings end at a scrape.
        fresh = [name for name, control in self.controls.items() if control.accounting.counting_backend]
        if fresh:
            try:
                await self.scrape(fresh)
            except Exception:  # the controllers read the last snapshot, as between scrapes
                log.exception("the fresh backend scrape before the control tick failed")
        now = self.gateway.clock()
        for name, control in self.controls.items():
            try:
                self.tick_one(self.gateway.pool.by_name[name], control, now, peers=peers.get(name))
            except Exception:
                self.gateway.metrics.controller_tick_errors.labels(name).inc()
                if name not in self._failing:
                    log.exception("the control tick of %s failed; its limit holds, the other upstreams go on", name)
                self._failing.add(name)
            else:
                if name in self._failing:
                    log.info("the control tick of %s works again", name)
                self._failing.discard(name)
        try:
            self.capacity_tick(now)
        except Exception:
            log.exception("the capacity signal's tick failed; its figures hold")

    # --- the capacity signal ----------------------------------------------------------------------------
    def capacity_tick(self, now: float) -> list[ModelSignal]:
        """Step the capacity signal with every controlled upstream's last tick and export its figures."""
        if self.signal is None:
            return []
        readings: list[Reading] = []
        members: dict[str, list[str]] = {}
        for name, control in self.controls.items():
            upstream = self.gateway.pool.by_name[name]
            stats = control.last_stats
            model = serving_model(upstream)
            members.setdefault(model, []).append(name)
            readings.append(
                Reading(
                    upstream=name,
                    model=model,
                    saturated=self._saturated.get(name, False),
                    goodput_requests_per_s=0.0 if stats is None else stats.ok / stats.span_s,
                    output_tokens_per_s=0.0 if stats is None else stats.output_tokens_per_s,
                    finished=tuple(sample.finished for sample in upstream.window.samples(now)),
                    backlog=upstream.limiter.inflight,
                    window_s=upstream.window.horizon_s,
                )
            )
        queued = {model: self.gateway.queue.depth_among(names) for model, names in members.items()}
        signals = self.signal.step(now, readings, queued)
        self._capacity_series.export(self.gateway.metrics, signals)
        return signals

    async def share(self) -> dict[str, Peers | None]:
        """Every upstream's exchange with the shared state at once (a slow Redis costs one timeout, not one per
        upstream); one that fails is None, each replica on its own for it."""
        assert self.board is not None
        board, names = self.board, list(self.controls)

        async def one(name: str) -> Peers | None:
            upstream = self.gateway.pool.by_name[name]
            demand = upstream.limiter.inflight + self.gateway.queue.depth_for(name)
            return await board.exchange(upstream.url, demand, upstream.limiter.limit)

        answers = await asyncio.gather(*(one(name) for name in names), return_exceptions=True)
        peers: dict[str, Peers | None] = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer  # cancelled: the loop is stopping
                log.error("the shared-state exchange of %s failed", name, exc_info=answer)
                answer = None
            peers[name] = answer
        return peers

    def tick_one(
        self, upstream: Upstream, control: UpstreamControl, now: float, *, peers: Peers | None = None
    ) -> Decision:
        gateway = self.gateway
        limiter = upstream.limiter
        scraper = self.scrapers.get(upstream.name)
        snapshot = scraper.latest if scraper is not None else NOT_SCRAPED
        state = LimiterState(
            limit=limiter.limit,
            inflight=limiter.inflight,
            peak_inflight=limiter.take_peak(),
            queue_depth=gateway.queue.depth_for(upstream.name),
        )
        cap = hard_cap(snapshot, upstream, gateway.settings.kv_capacity_tokens, gateway.settings.backend_max_seqs, now)
        decision = control.tick(now, upstream.window, state, self.headroom(snapshot), hard_cap=cap, peers=peers)
        # The capacity signal's "at its limit": the limit bound over the tick (reached, or requests waited for it).
        self._saturated[upstream.name] = state.queue_depth > 0 or state.peak_inflight >= max(state.limit, 1)
        limit = self.bounded(decision.limit)
        if limit != limiter.limit:
            limiter.set_limit(limit)
            gateway.queue.dispatch()
        metrics = gateway.metrics
        metrics.decisions.labels(upstream.name, decision.action.value, decision.reason.value).inc()
        _set_or_absent(metrics.hard_cap, upstream.name, cap)
        stats = control.last_stats
        if stats is not None:
            metrics.window_tokens_per_s.labels(upstream.name).set(stats.output_tokens_per_s)
            _set_or_absent(metrics.window_ttft_p99, upstream.name, stats.upstream_ttft_p99)
            _set_or_absent(metrics.window_tpot_p99, upstream.name, stats.tpot_p99)
        if decision.changed:
            log.info("limit changed", extra=control.log_fields(decision))
        return decision

    def headroom(self, snapshot: BackendSnapshot) -> Headroom:
        return Headroom(
            gpus=tuple(self.gpus),
            gpus_at=self.gpus_at,
            gpus_reason=self.gpu_source.reason,
            kv_usage=snapshot.kv_usage,
            backend_running=None if snapshot.running is None else int(snapshot.running),
            backend_waiting=None if snapshot.waiting is None else int(snapshot.waiting),
            preemptions_total=snapshot.preemptions_total,
            generation_tokens_total=snapshot.generation_tokens_total,
            generation_tokens_live=snapshot.generation_tokens_live,
            backend_at=snapshot.taken_at,
        )

    async def leave_board(self) -> None:
        """On shutdown: this replica's shared entries go, so the others take its share at once."""
        if self.board is not None:
            await self.board.leave()
            await self.board.close()

    def close(self) -> None:
        self.gpu_source.close()


def _set_or_absent(gauge: Gauge, label: str, value: float | None) -> None:
    """Unknown is no series, not NaN or 0: a NaN poisons every sum it joins, a 0 reads as a real cap."""
    if value is None:
        gauge.remove(label)
    else:
        gauge.labels(label).set(value)
