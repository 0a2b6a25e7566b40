"""Runs the controllers of a live gateway: gathers each tick's inputs, applies the decisions.

Three loops feed and drive the pure controllers in ``gateway.control``:

* the backend scrape (every ``metrics_interval_s``): each upstream's own ``/metrics`` through the
  adapters in ``gateway.telemetry.backends`` (KV usage, waiting, preemptions, slots);
* the NVML read (every ``nvml_interval_s``, in a worker thread so the driver never blocks requests);
* the control tick (every ``control_interval_s``): window statistics + limiter numbers + headroom
  -> ``UpstreamControl.tick`` -> the new limit on the limiter, the queue re-dispatched, the decision
  counted in Prometheus and, when the limit moved, one structured log line.

None of this is on the request path; a failure in one loop is logged and the loop goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

from gateway.control.algorithm import Decision
from gateway.control.config import AimdConfig
from gateway.control.observation import GpuHeadroom, Headroom, LimiterState
from gateway.control.controller import UpstreamControl
from gateway.server.parts import Gateway
from gateway.server.start_points import load_start_points
from gateway.telemetry.backends import BackendScraper, BackendSnapshot
from gateway.telemetry.nvml import GpuSource, NvmlSource
from gateway.server.upstreams import Upstream

log = logging.getLogger("sweetspot.controller")

NOT_SCRAPED = BackendSnapshot(kind="openai", error="not scraped yet")


@dataclass
class ControlLoop:
    """The controllers and headroom sources of one gateway."""

    gateway: Gateway
    gpu_source: GpuSource
    scrapers: dict[str, BackendScraper] = field(default_factory=dict)
    controls: dict[str, UpstreamControl] = field(default_factory=dict)
    gpus: list[GpuHeadroom] = field(default_factory=list)
    gpus_at: float | None = None

    @classmethod
    def build(cls, gateway: Gateway, gpu_source: GpuSource | None = None) -> "ControlLoop":
        settings = gateway.settings
        loop = cls(gateway, gpu_source or NvmlSource(settings.gpus))
        starts = load_start_points(settings.sweep_result, [upstream.name for upstream in gateway.pool])
        config = AimdConfig.from_settings(settings)
        for upstream in gateway.pool:
            start = starts.get(upstream.name)
            gateway.metrics.sweet_spot.labels(upstream.name).set(0)
            gateway.metrics.sweep_peak_tokens_per_s.labels(upstream.name).set(0)
            initial = start.limit if start is not None else settings.initial_limit
            initial = max(settings.limit_min, min(initial, settings.limit_max))
            upstream.limiter.set_limit(initial)
            if start is not None:
                gateway.metrics.sweet_spot.labels(upstream.name).set(start.limit)
                if start.peak_tokens_per_s:
                    gateway.metrics.sweep_peak_tokens_per_s.labels(upstream.name).set(start.peak_tokens_per_s)
            if settings.control_enabled:
                control = UpstreamControl(upstream.name, config, initial_limit=initial, start=start)
                loop.controls[upstream.name] = control
        return loop

    def start(self) -> None:
        """Create the scrapers; needs the running event loop (they share the upstream session)."""
        settings = self.gateway.settings
        for upstream in self.gateway.pool:
            self.scrapers[upstream.name] = BackendScraper(
                upstream.url, kind=settings.backend, session=self.gateway.client.poll_session,
                api_key=settings.upstream_api_key, clock=self.gateway.clock,
                timeout_s=min(settings.metrics_interval_s, 5.0),
                read_health=False,  # the health poll (gateway.server.upstreams) reads /health already
            )
            self._bind_gauges(upstream)

    # --- gauges read at scrape time ---------------------------------------------------------------
    def _bind_gauges(self, upstream: Upstream) -> None:
        metrics, name, clock = self.gateway.metrics, upstream.name, self.gateway.clock
        scraper = self.scrapers[name]

        def nan_if_none(value: float | None) -> float:
            return float("nan") if value is None else float(value)

        def age() -> float:
            value = scraper.latest.age(clock())
            return float("inf") if value is None else value

        metrics.backend_kv_usage.labels(name).set_function(lambda: nan_if_none(scraper.latest.kv_usage))
        metrics.backend_running.labels(name).set_function(lambda: nan_if_none(scraper.latest.running))
        metrics.backend_waiting.labels(name).set_function(lambda: nan_if_none(scraper.latest.waiting))
        metrics.backend_preemptions.labels(name).set_function(lambda: nan_if_none(scraper.latest.preemptions_total))
        metrics.backend_metrics_age.labels(name).set_function(age)

    # --- loops --------------------------------------------------------------------------------------
    async def scrape(self) -> None:
        async def one(name: str, scraper: BackendScraper) -> None:
            snapshot = await scraper.scrape()
            self.gateway.pool.by_name[name].streams_keep_alive = scraper.kind == "vllm"
            if snapshot.error is not None:
                self.gateway.metrics.backend_scrape_errors.labels(name).inc()

        await asyncio.gather(*(one(name, scraper) for name, scraper in self.scrapers.items()))

    async def read_gpus(self) -> None:
        gpus = await asyncio.to_thread(self.gpu_source.read)
        self.gpus, self.gpus_at = gpus, self.gateway.clock()
        for gpu in gpus:
            label = str(gpu.index)
            self.gateway.metrics.gpu_memory_free_ratio.labels(label).set(gpu.memory_free_ratio)
            if gpu.utilization is not None:
                self.gateway.metrics.gpu_utilization_ratio.labels(label).set(gpu.utilization)

    async def control(self) -> None:
        now = self.gateway.clock()
        for name, control in self.controls.items():
            self.tick_one(self.gateway.pool.by_name[name], control, now)

    def tick_one(self, upstream: Upstream, control: UpstreamControl, now: float) -> Decision:
        gateway = self.gateway
        limiter = upstream.limiter
        scraper = self.scrapers.get(upstream.name)
        snapshot = scraper.latest if scraper is not None else NOT_SCRAPED
        # Requests admitted above the limit by the tenants' burst rule are not the limit's doing.
        state = LimiterState(limit=limiter.limit, inflight=limiter.inflight - limiter.bursting,
                             peak_inflight=limiter.take_peak(), queue_depth=gateway.queue.depth_for(upstream.name))
        cap = hard_cap(snapshot, upstream, gateway.settings.kv_capacity_tokens, now)
        decision = control.tick(now, upstream.window, state, self.headroom(snapshot), hard_cap=cap,
                                tokens_total=upstream.window.tokens_total)
        if decision.limit != limiter.limit:
            limiter.set_limit(decision.limit)
            gateway.queue.dispatch()
        metrics = gateway.metrics
        metrics.decisions.labels(upstream.name, decision.action.value, decision.reason.value).inc()
        metrics.hard_cap.labels(upstream.name).set(cap or 0)
        stats = control.last_stats
        if stats is not None:
            metrics.window_tokens_per_s.labels(upstream.name).set(stats.output_tokens_per_s)
            metrics.window_ttft_p99.labels(upstream.name).set(_or_nan(stats.upstream_ttft_p99))
            metrics.window_tpot_p99.labels(upstream.name).set(_or_nan(stats.tpot_p99))
        if decision.changed:
            log.info(json.dumps(control.log_fields(decision), default=str))
        return decision

    def headroom(self, snapshot: BackendSnapshot) -> Headroom:
        return Headroom(
            gpus=tuple(self.gpus), gpus_at=self.gpus_at, gpus_reason=self.gpu_source.reason,
            kv_usage=snapshot.kv_usage,
            backend_running=None if snapshot.running is None else int(snapshot.running),
            backend_waiting=None if snapshot.waiting is None else int(snapshot.waiting),
            preemptions_total=snapshot.preemptions_total,
            backend_at=snapshot.taken_at,
        )

    def close(self) -> None:
        self.gpu_source.close()


def hard_cap(snapshot: BackendSnapshot, upstream: Upstream, planned_kv_tokens: int | None, now: float) -> int | None:
    """The most concurrency the upstream can hold: llama-server's slots, or KV capacity divided by the
    typical request's footprint (prompt + output tokens of recent requests). None when unknown."""
    if snapshot.total_slots:
        return int(snapshot.total_slots)
    capacity = snapshot.kv_capacity_tokens or planned_kv_tokens
    if not capacity:
        return None
    stats = upstream.window.stats(now)
    if stats.mean_prompt_tokens is None or stats.mean_output_tokens is None:
        return None
    footprint = max(stats.mean_prompt_tokens + stats.mean_output_tokens, 1.0)
    return max(int(capacity // footprint), 1)


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value
