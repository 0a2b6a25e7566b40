"""Every Prometheus metric the gateway exports, defined in one place.

Names are part of the public contract (dashboards and alert rules in ``deploy/`` query them), so they
change only with a note in ``CHANGELOG.md``. All are prefixed ``sweetspot_``; per-backend series carry an
``upstream`` label holding the upstream's base URL as configured.

Each :func:`create_app` builds its own :class:`GatewayMetrics` on its own registry, so several gateways
(or tests) in one process never share counters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Literal, TypeVar, cast

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

M = TypeVar("M", Counter, Gauge, Histogram)
Reader = Callable[[], float | None]

# `_created` series double the exposition size for no dashboard use (vLLM turns them off too).
disable_created_metrics()

# LLM latencies span four orders of magnitude: a cached first token in a few ms, a long generation
# queued behind others in minutes.
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    45.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
# Time per output token: ~5 ms on a fast GPU with one stream, ~100 ms is the edge of readable streaming.
TPOT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
)
# Tokens per request: a one-word answer to a book-length prompt.
PROMPT_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
OUTPUT_TOKEN_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# How late a timer of the event loop fires: a healthy proxy stays under a millisecond; tens of
# milliseconds delay every stream's chunks and first tokens.
LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# The gateway's own cost per request: tens of microseconds to a few milliseconds.
OVERHEAD_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
)


class ReadAtScrape(Collector):
    """A family whose values are read from live objects when Prometheus scrapes.

    A reader that returns None (or a non-finite number) leaves its series out of that scrape: an unknown
    value is absent, never NaN, so ``absent()``, ``or`` and alert expressions see "no data" for what it is
    instead of a number that poisons every sum it joins. ``kind="counter"`` exports a cumulative value
    read from elsewhere (a backend's own counter) with the counter type, so ``rate()`` handles its resets.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        registry: CollectorRegistry,
        kind: Literal["gauge", "counter"] = "gauge",
    ) -> None:
        self.name, self.documentation, self.labelnames, self.kind = name, documentation, labelnames, kind
        self._readers: dict[tuple[str, ...], Reader] = {}
        registry.register(self)

    def bind(self, labels: tuple[str, ...], reader: Reader) -> None:
        self._readers[labels] = reader

    def _family(self) -> GaugeMetricFamily | CounterMetricFamily:
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for labels, reader in list(self._readers.items()):
            value = reader()
            if value is not None and math.isfinite(value):
                family.add_metric(list(labels), float(value))
        yield family


class GatewayMetrics:
    """The gateway's metrics on one registry. Attribute names mirror the exported names."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._children: dict[tuple[object, tuple[str, ...]], object] = {}
        r = self.registry

        self.info = Info("sweetspot", "Gateway build information.", registry=r)
        # The standard process_*, python_info and python_gc_* series (CPU, memory, file descriptors, GC
        # pauses), as every Python exporter has them, on this registry rather than the global one.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.event_loop_lag = Gauge(
            "sweetspot_event_loop_lag_seconds",
            "How late the latest periodic timer of the event loop fired: time the single loop spent busy "
            "before it could run it. The first sign of a saturated proxy.",
            registry=r,
        )
        self.event_loop_lag_hist = Histogram(
            "sweetspot_event_loop_lag_distribution_seconds",
            "Every measured event-loop lag.",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )

        # --- requests, as the clients see them -----------------------------------------------------
        self.requests = Counter(
            "sweetspot_requests",
            "Client requests answered, by route, HTTP status and model (empty before the model is known).",
            ["route", "status", "model"],
            registry=r,
        )
        self.rejections = Counter(
            "sweetspot_rejections",
            "Requests the gateway refused itself, by reason (queue_full, queue_timeout, no_upstream, "
            "client_disconnected, unauthorized, bad_request, body_too_large, model_not_found).",
            ["reason"],
            registry=r,
        )

        # --- admission -----------------------------------------------------------------------------
        self.queue_depth = Gauge("sweetspot_queue_depth", "Requests waiting for a permit.", registry=r)
        self.queue_capacity = Gauge("sweetspot_queue_capacity", "Configured max_queue.", registry=r)
        self.queue_wait = Histogram(
            "sweetspot_queue_wait_seconds",
            "Time requests spent queued, by how the wait ended (admitted, timed_out, client_gone, rejected) "
            "and priority class (one of the configured priority_classes).",
            ["outcome", "priority"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge(
            "sweetspot_inflight", "Requests admitted to the upstream and not finished.", ["upstream"], registry=r
        )
        self.limit = Gauge("sweetspot_limit", "Current concurrency limit of the upstream.", ["upstream"], registry=r)
        self.upstream_healthy = Gauge(
            "sweetspot_upstream_healthy", "1 when the upstream's health check passes.", ["upstream"], registry=r
        )

        # --- per-request measurements --------------------------------------------------------------
        self.ttft = Histogram(
            "sweetspot_ttft_seconds",
            "Time to first token as the client saw it, queue wait included.",
            ["upstream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_ttft = Histogram(
            "sweetspot_upstream_ttft_seconds",
            "Time to first token from admission: what the backend caused.",
            ["upstream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "sweetspot_tpot_seconds",
            "Time per output token after the first: (E2E - TTFT) / (tokens - 1).",
            ["upstream"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sweetspot_e2e_seconds",
            "End-to-end request latency as the client saw it.",
            ["upstream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "sweetspot_prompt_tokens",
            "Prompt tokens of finished requests (from upstream usage).",
            ["upstream", "model"],
            registry=r,
        )
        self.output_tokens = Counter(
            "sweetspot_output_tokens",
            "Output tokens of finished requests (from upstream usage).",
            ["upstream", "model"],
            registry=r,
        )
        self.request_prompt_tokens = Histogram(
            "sweetspot_request_prompt_tokens",
            "Prompt tokens per finished request that reported usage.",
            ["upstream", "model"],
            buckets=PROMPT_TOKEN_BUCKETS,
            registry=r,
        )
        self.request_output_tokens = Histogram(
            "sweetspot_request_output_tokens",
            "Output tokens per finished request.",
            ["upstream", "model"],
            buckets=OUTPUT_TOKEN_BUCKETS,
            registry=r,
        )
        self.upstream_requests = Counter(
            "sweetspot_upstream_requests",
            "Requests sent upstream, by outcome (ok, upstream_error, client_cancelled, timed_out, client_error).",
            ["upstream", "outcome", "model"],
            registry=r,
        )
        self.upstream_retries = Counter(
            "sweetspot_upstream_retries",
            "Requests re-sent before any byte came back (stale keep-alive connection or failover).",
            ["upstream", "reason"],
            registry=r,
        )
        self.overhead = Histogram(
            "sweetspot_overhead_seconds",
            "Time the gateway itself adds to a request: arrival to upstream send, queue wait excluded.",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )

        # --- the controller ------------------------------------------------------------------------
        self.decisions = Counter(
            "sweetspot_controller_decisions",
            "Controller decisions, by action (increase, decrease, hold) and reason.",
            ["upstream", "action", "reason"],
            registry=r,
        )
        self.window_tokens_per_s = Gauge(
            "sweetspot_window_output_tokens_per_second",
            "Output tokens/s over the controller's sliding window.",
            ["upstream"],
            registry=r,
        )
        self.window_ttft_p99 = Gauge(
            "sweetspot_window_upstream_ttft_p99_seconds",
            "p99 TTFT net of queue wait over the sliding window (absent while the window has none).",
            ["upstream"],
            registry=r,
        )
        self.window_tpot_p99 = Gauge(
            "sweetspot_window_tpot_p99_seconds",
            "p99 TPOT over the sliding window (absent while the window has none).",
            ["upstream"],
            registry=r,
        )
        self.sweet_spot = Gauge(
            "sweetspot_sweep_sweet_spot",
            "Sweet spot measured by `sweetspot sweep` for the upstream (absent when none was given).",
            ["upstream"],
            registry=r,
        )
        self.sweep_peak_tokens_per_s = Gauge(
            "sweetspot_sweep_peak_tokens_per_second",
            "Peak output tokens/s measured by `sweetspot sweep` (the controller's reference; absent without one).",
            ["upstream"],
            registry=r,
        )
        self.objective = Gauge(
            "sweetspot_objective_seconds",
            "The latency objectives the controller holds (objective: ttft_p99, tpot_p99); absent when unset. "
            "Alerts compare what clients see with them.",
            ["objective"],
            registry=r,
        )
        self.hard_cap = Gauge(
            "sweetspot_limit_hard_cap",
            "Upper bound on the limit from the upstream's real capacity (slots, --max-num-seqs, KV capacity); "
            "absent when unknown.",
            ["upstream"],
            registry=r,
        )
        self.controller_tick_errors = Counter(
            "sweetspot_controller_tick_errors",
            "Control ticks of the upstream that raised (its limit held for that tick; the other upstreams ticked).",
            ["upstream"],
            registry=r,
        )
        self.share_board_rejected = Counter(
            "sweetspot_share_board_rejected_entries",
            "Entries of the replicas' shared state (Redis) rejected and deleted, by reason: replica_id (not "
            "host:pid), malformed (not three numbers, or the key not a hash), not_finite (nan, inf), out_of_range "
            "(negative, limit outside limit_min..limit_max, demand over limit_max + max_queue), future (dated "
            "ahead of this replica's clock by more than the allowed skew).",
            ["upstream", "reason"],
            registry=r,
        )

        # --- the capacity signal (gateway/control/capacity_signal.py; docs/deploy.md, "The capacity signal") ----
        # Every figure is absent until it is measured: a backend's capacity until its limit has bound for a
        # whole window, the pool's and the desired count until one backend of the model has been measured.
        self.upstream_capacity_requests = Gauge(
            "sweetspot_upstream_capacity_requests_per_second",
            "Successful requests/s the upstream delivered over a window in which its limit bound throughout: what "
            "one backend does at its limit (this replica's share of it when replicas share the backend).",
            ["upstream", "model"],
            registry=r,
        )
        self.upstream_capacity_tokens = Gauge(
            "sweetspot_upstream_capacity_tokens_per_second",
            "Output tokens/s the upstream delivered over a window in which its limit bound throughout.",
            ["upstream", "model"],
            registry=r,
        )
        self.pool_capacity_requests = Gauge(
            "sweetspot_pool_capacity_requests_per_second",
            "Median over the model's measured upstreams of sweetspot_upstream_capacity_requests_per_second.",
            ["model"],
            registry=r,
        )
        self.pool_capacity_tokens = Gauge(
            "sweetspot_pool_capacity_tokens_per_second",
            "Median over the model's measured upstreams of sweetspot_upstream_capacity_tokens_per_second.",
            ["model"],
            registry=r,
        )
        self.demand_requests = Gauge(
            "sweetspot_demand_requests_per_second",
            "Requests/s arriving for the model at this replica, what waits included: completions/s plus the growth "
            "of in flight + queued over the window.",
            ["model"],
            registry=r,
        )
        self.upstreams_desired = Gauge(
            "sweetspot_upstreams_desired",
            "Backends the model's demand needs at target_utilisation of the pool's capacity, "
            "ceil(demand / (target_utilisation x pool capacity)), up at once and down after scale_down_after_s.",
            ["model"],
            registry=r,
        )
        self.upstreams_serving = Gauge(
            "sweetspot_upstreams_serving",
            "Upstreams the gateway knows serving the model (sweetspot_upstreams_desired's counterpart).",
            ["model"],
            registry=r,
        )

        # --- headroom: GPUs and the backend's own signals ------------------------------------------
        self.gpu_memory_free_ratio = Gauge(
            "sweetspot_gpu_memory_free_ratio", "NVML free memory / total, per GPU.", ["gpu"], registry=r
        )
        self.gpu_utilization_ratio = Gauge(
            "sweetspot_gpu_utilization_ratio", "NVML GPU utilisation (0-1), per GPU.", ["gpu"], registry=r
        )
        # Read from each upstream's latest scrape; a value the backend does not report is absent.
        upstream = ("upstream",)
        self.backend_kv_usage = ReadAtScrape(
            "sweetspot_backend_kv_cache_usage_ratio",
            "The backend's KV-cache usage (0-1) from its /metrics.",
            upstream,
            r,
        )
        self.backend_running = ReadAtScrape(
            "sweetspot_backend_requests_running",
            "Requests the backend reports running.",
            upstream,
            r,
        )
        self.backend_waiting = ReadAtScrape(
            "sweetspot_backend_requests_waiting",
            "Requests the backend reports waiting in its own queue.",
            upstream,
            r,
        )
        self.backend_preemptions = ReadAtScrape(
            "sweetspot_backend_preemptions",
            "The backend's own cumulative preemption counter as last scraped (resets when the backend restarts).",
            upstream,
            r,
            kind="counter",
        )
        self.backend_metrics_age = ReadAtScrape(
            "sweetspot_backend_metrics_age_seconds",
            "Seconds since the backend's /metrics were last read successfully (since the gateway started "
            "reading them, before the first success).",
            upstream,
            r,
        )
        self.backend_scrape_errors = Counter(
            "sweetspot_backend_scrape_errors", "Failed scrapes of the backend's /metrics.", ["upstream"], registry=r
        )

        # --- routing among upstreams (gateway/server/admission/routing.py; only with routing = prefix) -------------
        self.routing_decisions = Counter(
            "sweetspot_routing_decisions",
            "Requests routed among several upstreams with room, by why that upstream: prefix (it holds the "
            "longest known prefix of the prompt), load (another holds more but is full or busier than the "
            "saving is worth), least_loaded (no upstream is known to hold any of it).",
            ["reason"],
            registry=r,
        )
        self.routing_prefix_chunks = Counter(
            "sweetspot_routing_prefix_chunks",
            "Prompt chunks (256 characters) of the requests routed to the upstream.",
            ["upstream"],
            registry=r,
        )
        self.routing_prefix_hit_chunks = Counter(
            "sweetspot_routing_prefix_hit_chunks",
            "Of those, chunks the gateway expected in the upstream's prefix cache (it served them recently): "
            "divided by sweetspot_routing_prefix_chunks, the estimated prefix hit rate.",
            ["upstream"],
            registry=r,
        )
        self.routing_prefix_map_entries = Gauge(
            "sweetspot_routing_prefix_map_entries",
            "Prompt-prefix chunks the router remembers (bounded by routing_prefix_map_max).",
            registry=r,
        )
        self.routing_adapter_decisions = Counter(
            "sweetspot_routing_adapter_decisions",
            "LoRA adapters' requests routed among several upstreams with room, by where the adapter stood on the "
            "chosen one: running (it joins the batch), resident (it ran there recently), cold (a free adapter slot, "
            "likely a load), swap (max_lora other adapters ran there: it waits for one to drain; every upstream "
            "with room was so). swap counts the adapter swaps routing caused.",
            ["placement"],
            registry=r,
        )

        self.tenants = TenantMetrics(r)

    def forget_upstream(self, name: str) -> int:
        """Remove every series labelled ``upstream=name``, of every metric that has the label (an upstream that
        left the pool: its series would otherwise hang on at their last value). Returns how many went."""
        removed = 0
        for attribute in list(vars(self).values()):
            if isinstance(attribute, MetricWrapperBase):
                names = attribute._labelnames
                if "upstream" not in names:
                    continue
                at = names.index("upstream")
                with attribute._lock:
                    keys = [key for key in attribute._metrics if key[at] == name]
                for key in keys:
                    attribute.remove(*key)
                removed += len(keys)
            elif isinstance(attribute, ReadAtScrape) and "upstream" in attribute.labelnames:
                at = attribute.labelnames.index("upstream")
                gone = [labels for labels in attribute._readers if labels[at] == name]
                for labels in gone:
                    del attribute._readers[labels]
                removed += len(gone)
        for cached in [cached for cached in self._children if name in cached[1]]:
            del self._children[cached]
        return removed

    def child(self, metric: M, *labels: str) -> M:
        """``metric.labels(*labels)``, bound once and kept. ``labels()`` takes a lock and builds its key on
        every call, which the request path would otherwise pay several times per request; the label values
        used here (upstreams, routes, statuses, outcomes) are few and fixed."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return cast(M, found)


# --- per tenant ------------------------------------------------------------------------------------
# Labelled `tenant`: a configured tenant's name, `default`, or `other` for every tenant without an entry of
# its own (header-named ones), so the number of series stays bounded whatever clients send.


class TenantMeters:
    """One tenant label's bound children, for the request path (``labels()`` costs a lock and a key)."""

    __slots__ = ("_label", "_rejections", "_rejections_metric", "output_tokens", "queue_wait", "requests")

    def __init__(self, metrics: TenantMetrics, label: str) -> None:
        self._label = label
        self.requests = metrics.requests.labels(label)
        self.queue_wait = metrics.queue_wait.labels(label)
        self.output_tokens = metrics.output_tokens.labels(label)
        self._rejections: dict[str, Counter] = {}
        self._rejections_metric = metrics.rejections

    def rejected(self, reason: str) -> None:
        child = self._rejections.get(reason)
        if child is None:
            child = self._rejections[reason] = self._rejections_metric.labels(self._label, reason)
        child.inc()


class TenantMetrics:
    """The per-tenant series. Queue depth and in-flight are read from the admission queue at scrape time."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "sweetspot_tenant_requests",
            "Client requests received on the proxied routes, by tenant.",
            ["tenant"],
            registry=r,
        )
        self.rejections = Counter(
            "sweetspot_tenant_rejections",
            "Requests the gateway refused, by tenant and reason (queue_full, tenant_queue_full, quota_exceeded, "
            "queue_timeout, no_upstream, shutting_down, bad_request, ...).",
            ["tenant", "reason"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "sweetspot_tenant_queue_depth", "Requests waiting for a permit, by tenant.", ["tenant"], registry=r
        )
        self.inflight = Gauge(
            "sweetspot_tenant_inflight", "Requests admitted and not finished, by tenant.", ["tenant"], registry=r
        )
        self.queue_wait = Histogram(
            "sweetspot_tenant_queue_wait_seconds",
            "Time admitted requests spent queued, by tenant.",
            ["tenant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.output_tokens = Counter(
            "sweetspot_tenant_output_tokens",
            "Output tokens of finished requests (upstream usage), by tenant.",
            ["tenant"],
            registry=r,
        )
        self._meters: dict[str, TenantMeters] = {}

    def meters(self, label: str) -> TenantMeters:
        found = self._meters.get(label)
        if found is None:
            found = self._meters[label] = TenantMeters(self, label)
        return found
