"""The gateway's run-time parts, built once per app from the settings and shared by the routes and the loops."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway import __version__
from gateway.control.window import SlidingWindow
from gateway.server.admission.admission_queue import AdmissionQueue
from gateway.server.admission.keys import KeyRing
from gateway.server.admission.limiter import Limiter
from gateway.server.admission.lora_affinity import AdapterAffinity
from gateway.server.admission.routing import MetricsObserver, PrefixMap, PrefixRouter, RandomRouter
from gateway.server.admission.tenants import TenantDirectory
from gateway.server.process.drain import DrainState
from gateway.server.upstream.discovery import UpstreamsFile, united
from gateway.server.upstream.dns_discovery import DnsUpstreams, is_dns, make_resolver
from gateway.server.upstream.pool import Upstream, UpstreamPool
from gateway.server.upstream.response_affinity import ResponseAffinity
from gateway.server.upstream.upstream_client import UpstreamClient
from gateway.settings import Settings
from gateway.telemetry.backends.snapshot import LoraState
from gateway.telemetry.metrics import GatewayMetrics


@dataclass
class Gateway:
    settings: Settings
    pool: UpstreamPool
    queue: AdmissionQueue[Upstream]
    client: UpstreamClient
    metrics: GatewayMetrics
    tenants: TenantDirectory
    clock: Callable[[], float] = time.monotonic
    drain: DrainState = field(default_factory=DrainState)
    responses: ResponseAffinity = field(init=False)  # which upstream created each stored response
    router: PrefixRouter | None = None  # None: least-loaded routing (the setting, or a single upstream)
    admin_keys: KeyRing[bool] = field(init=False)  # the operator's key, for /metrics and /state
    upstreams_file: UpstreamsFile | None = None  # the upstreams_file setting, as last read
    dns: DnsUpstreams | None = None  # the last good addresses of the dns+ upstreams (None: never resolved)

    def __post_init__(self) -> None:
        settings = self.settings
        self.responses = ResponseAffinity(
            max_entries=settings.response_affinity_max,
            ttl_s=settings.response_affinity_ttl_s,
            owned=self.tenants.requires_key,  # with client keys, a stored response is its tenant's only
            clock=self.clock,
        )
        self.admin_keys = KeyRing([(settings.admin_api_key, True)] if settings.admin_api_key else [])

    @classmethod
    def build(cls, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> Gateway:
        listing = UpstreamsFile(settings.upstreams_file) if settings.upstreams_file is not None else None
        entries = united(settings.upstreams, listing.load() if listing is not None else [])
        if not entries:
            raise ValueError(
                "no upstream configured: pass --upstream URL, set SWEETSPOT_UPSTREAMS or list them in upstreams_file"
            )
        # The dns+ names join once resolved, before the first request (gateway.server.feedback.membership).
        urls = [entry for entry in entries if not is_dns(entry)]
        resolve_timeout_s = min(max(settings.discovery_interval_s, 1.0), 5.0)
        dns = DnsUpstreams(make_resolver(settings.discovery_nameserver, resolve_timeout_s))
        metrics = GatewayMetrics()
        upstreams = [
            Upstream(
                url,
                Limiter(url, settings.initial_limit),
                SlidingWindow(settings.window_s),
                public_name=f"upstream-{index}",
            )
            for index, url in enumerate(urls, start=1)
        ]
        router: PrefixRouter | None = None
        if settings.routing != "least_loaded" and (len(entries) > 1 or len(urls) < len(entries)):
            prefixes = PrefixMap(
                max_entries=settings.routing_prefix_map_max, ttl_s=settings.routing_prefix_ttl_s, clock=clock
            )
            observer = MetricsObserver(metrics)
            adapters = AdapterAffinity(  # reads the pool's scraped LoRA states once the pool exists (below)
                _no_lora_state, weight=settings.routing_lora_weight, swap_penalty=settings.routing_lora_swap_penalty
            )
            router = (
                RandomRouter(prefixes, observer=observer)
                if settings.routing == "random"
                else PrefixRouter(
                    prefixes, load_weight=settings.routing_load_weight, observer=observer, adapters=adapters
                )
            )
        tenants = TenantDirectory(settings, clock=clock, meters=metrics.tenants.meters)
        queue = AdmissionQueue(
            upstreams,
            max_queue=settings.max_queue,
            max_queued_bytes=settings.max_queued_bytes,
            clock=clock,
            choose=None if router is None else router.choose,
            routed_release=None if router is None else router.released,
            classes=len(settings.priority_classes),
            discipline=settings.queue_discipline,
            starvation_after=settings.starvation_after,
            default_tenant=tenants.default,
            reserve=settings.tenant_reserve,
        )
        client = UpstreamClient(
            connect_timeout_s=settings.connect_timeout_s,
            total_timeout_s=settings.upstream_timeout_s,
            stream_idle_timeout_s=settings.stream_idle_timeout_s,
            metrics=metrics,
        )
        gateway = cls(
            settings,
            UpstreamPool(upstreams, aliases=settings.model_aliases, default_model=settings.default_model),
            queue,
            client,
            metrics,
            tenants,
            clock,
            router=router,
            upstreams_file=listing,
            dns=dns,
        )
        if router is not None and router.adapters is not None:
            router.adapters.state_of = gateway.pool.lora_state
        _bind_metrics(gateway)
        return gateway


def _no_lora_state(_: str) -> LoraState | None:
    return None


def _bind_metrics(gateway: Gateway) -> None:
    """The one place the parts are wired to the metrics: gauges read at scrape time from the live objects (no
    bookkeeping on the request path), and the figures fixed at start."""
    metrics = gateway.metrics
    metrics.info.info({"version": __version__})
    metrics.queue_capacity.set(gateway.settings.max_queue)
    metrics.queue_depth.set_function(lambda: gateway.queue.depth)
    if gateway.router is not None:
        prefixes = gateway.router.prefixes
        metrics.routing_prefix_map_entries.set_function(lambda: len(prefixes))
    for upstream in gateway.pool:
        bind_upstream_gauges(metrics, upstream)
    for label in gateway.tenants.labels():
        _bind_tenant_gauges(gateway, label)


def _bind_tenant_gauges(gateway: Gateway, label: str) -> None:
    tenants, per_tenant = gateway.tenants, gateway.metrics.tenants
    per_tenant.queue_depth.labels(label).set_function(lambda: sum(t.queued for t in tenants if t.label == label))
    per_tenant.inflight.labels(label).set_function(lambda: sum(t.inflight for t in tenants if t.label == label))


def bind_upstream_gauges(metrics: GatewayMetrics, upstream: Upstream) -> None:
    """An upstream's gauges read at scrape time (at start, and for one that joins later)."""
    name, limiter = upstream.name, upstream.limiter
    metrics.inflight.labels(name).set_function(lambda: limiter.inflight)
    metrics.limit.labels(name).set_function(lambda: limiter.limit)
    metrics.upstream_healthy.labels(name).set_function(lambda: int(upstream.healthy))
