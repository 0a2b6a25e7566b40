"""The gateway's parts, built once per app and shared by the routes and the background loops."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.admission import AdmissionQueue, Limiter
from gateway.control.window import SlidingWindow
from gateway.proxy import UpstreamClient
from gateway.settings import Settings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.upstreams import Upstream, UpstreamPool


@dataclass
class Gateway:
    settings: Settings
    pool: UpstreamPool
    queue: AdmissionQueue
    client: UpstreamClient
    metrics: GatewayMetrics
    clock: Callable[[], float] = time.monotonic
    # Per-upstream controller objects and other run-time parts, keyed by upstream name.
    controllers: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> "Gateway":
        if not settings.upstreams:
            raise ValueError("no upstream configured: pass --upstream URL or set SWEETSPOT_UPSTREAMS")
        metrics = GatewayMetrics()
        upstreams = [
            Upstream(url, Limiter(url, settings.initial_limit), SlidingWindow(settings.window_s))
            for url in settings.upstreams
        ]
        pool = UpstreamPool(upstreams)
        queue = AdmissionQueue([u.limiter for u in upstreams], max_queue=settings.max_queue, clock=clock)
        client = UpstreamClient(
            connect_timeout_s=settings.connect_timeout_s,
            total_timeout_s=settings.upstream_timeout_s,
            metrics=metrics,
        )
        from gateway import __version__

        metrics.info.info({"version": __version__})
        metrics.queue_capacity.set(settings.max_queue)
        for upstream in upstreams:
            metrics.limit.labels(upstream.name).set(upstream.limiter.limit)
            metrics.inflight.labels(upstream.name).set(0)
            metrics.upstream_healthy.labels(upstream.name).set(1)
        return cls(settings, pool, queue, client, metrics, clock)

    def upstream_headers(self, authorization: str | None, request_id: str, *, stream: bool,
                         keep_alive: bool = False) -> dict[str, str]:
        """Headers for an upstream request: the configured upstream key replaces the client's.

        A streamed request asks for its connection to be closed afterwards unless the upstream is known to
        keep it usable (``keep_alive``: :attr:`Upstream.streams_keep_alive`, vLLM). llama-server closes it
        anyway while announcing keep-alive, and such connections, pooled, pile up dead; under many
        concurrent streams a request could draw one on each of its resends and fail (1-5 in 800 at 32
        streams). Asked in the request, the server says ``Connection: close`` in its reply and the client
        never pools the connection, however fast the stream ends. vLLM's Python front end, on the other
        hand, pays for every connection it accepts, and its kept connections behave."""
        headers = {"content-type": "application/json", "x-request-id": request_id}
        if stream:
            headers["accept"] = "text/event-stream"
            if not keep_alive:
                headers["connection"] = "close"
        if self.settings.upstream_api_key:
            headers["authorization"] = f"Bearer {self.settings.upstream_api_key}"
        elif authorization:
            headers["authorization"] = authorization
        return headers

    def poll_headers(self) -> dict[str, str]:
        if self.settings.upstream_api_key:
            return {"authorization": f"Bearer {self.settings.upstream_api_key}"}
        return {}
