"""Operational endpoints: liveness, readiness, Prometheus metrics and a JSON view of the state."""

from __future__ import annotations

import dataclasses
import os

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from gateway.server.feedback.control_loop import ControlLoop
from gateway.server.parts import Gateway
from gateway.server.routes.auth import raw_header, unauthorized
from gateway.settings import OTHER_TENANTS

router = APIRouter()


@router.get("/healthz")
async def healthz() -> Response:
    """Alive: the process answers. Says nothing about the upstreams (that is /readyz)."""
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    """Ready when this gateway can take requests: it serves and is not draining, whatever its upstreams' health.

    The upstreams are the same for every replica: if their health decided readiness, a pool that is down
    would take every gateway out of its Service at once, and clients would get connection errors instead
    of the 503 + Retry-After the gateway answers them (and a rollout would stall). Their state is in the
    body and in ``sweetspot_upstream_healthy``, which the alerts watch.

    Anyone who can reach the gateway can read this, so it names each upstream by its public name and its
    error in words that name no host (``health_error``); the exception's own words, which do, are on /state."""
    gateway: Gateway = request.app.state.gateway
    upstreams = {u.public_name: {"healthy": u.healthy, "error": u.health_error} for u in gateway.pool}
    draining = gateway.drain.draining
    ready = not draining
    body = {
        "ready": ready,
        "draining": draining,
        "any_upstream_healthy": gateway.pool.any_healthy(),
        "upstreams": upstreams,
    }
    return JSONResponse(body, status_code=200 if ready else 503)


def admin_denied(request: Request) -> Response | None:
    """401 unless the request carries the admin key (when one is set): /metrics and /state show the
    upstreams' URLs and the gateway's inner state."""
    gateway: Gateway = request.app.state.gateway
    headers = request.scope["headers"]
    if not gateway.admin_keys or gateway.admin_keys.find(
        raw_header(headers, b"authorization"), raw_header(headers, b"x-api-key")
    ):
        return None
    return unauthorized(gateway.metrics, "this route needs the admin key (Authorization: Bearer <admin_api_key>)")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    denied = admin_denied(request)
    if denied is not None:
        return denied
    gateway: Gateway = request.app.state.gateway
    return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/state")
async def state(request: Request) -> Response:
    """Each upstream's limiter, window statistics and controller state, plus the queue."""
    denied = admin_denied(request)
    if denied is not None:
        return denied
    gateway: Gateway = request.app.state.gateway
    control_loop: ControlLoop = request.app.state.control_loop
    now = gateway.clock()
    upstreams = []
    for upstream in gateway.pool:
        limiter = upstream.limiter
        entry = {
            "url": upstream.url,
            "healthy": upstream.healthy,
            "health_error": upstream.health_error,
            "health_detail": upstream.health_detail,
            "retiring": upstream.retiring,
            "models": [m.get("id") for m in upstream.models] if upstream.models is not None else None,
            "limit": limiter.limit,
            "inflight": limiter.inflight,
            "streams_keep_alive": upstream.streams_keep_alive,
            "window": upstream.window.stats(now).as_dict(),
        }
        controller = control_loop.controls.get(upstream.name)
        if controller is not None:
            entry["controller"] = controller.state()
        scraper = control_loop.scrapers.get(upstream.name)
        if scraper is not None:
            snapshot = scraper.latest
            entry["backend"] = {**dataclasses.asdict(snapshot), "age_s": snapshot.age(now)}
        upstreams.append(entry)
    queue = {
        "depth": gateway.queue.depth,
        "max_queue": gateway.queue.max_queue,
        "drain_rate_per_s": round(gateway.queue.drain_rate(), 3),
        "retry_after_s": gateway.queue.retry_after(),
        "by_class": {name: gateway.queue.class_depth(index) for index, name in enumerate(gateway.tenants.classes)},
    }
    router = gateway.router
    routing: dict[str, object] = {"policy": gateway.settings.routing if router is not None else "least_loaded"}
    if router is not None:
        routing["prefix_map_entries"] = len(router.prefixes)
        routing["prefix_map_max"] = router.prefixes.max_entries
        if router.adapters is not None:
            routing["lora_weight"] = router.adapters.weight
            routing["lora_swap_penalty"] = router.adapters.swap_penalty
    # Which process answered: with `serve --workers N` each worker is a replica with its own state.
    return JSONResponse(
        {
            "queue": queue,
            "routing": routing,
            "upstreams": upstreams,
            "tenants": tenant_state(gateway, now),
            "process": os.getpid(),
        }
    )


def tenant_state(gateway: Gateway, now: float) -> dict[str, dict[str, object]]:
    """Each configured tenant (and `default`) by name; the header-named ones summed up as `other`."""
    classes = gateway.tenants.classes
    out: dict[str, dict[str, object]] = {}
    other = {"tenants": 0, "queued": 0, "inflight": 0}
    for tenant in gateway.tenants:
        if tenant.label == OTHER_TENANTS:
            other["tenants"] += 1
            other["queued"] += tenant.queued
            other["inflight"] += tenant.inflight
            continue
        quota = tenant.quota
        out[tenant.name] = {
            "weight": tenant.weight,
            "priority": classes[tenant.priority],
            "max_priority": classes[tenant.max_priority],
            "queued": tenant.queued,
            "inflight": tenant.inflight,
            "max_queued": tenant.max_queued,
            "max_inflight": tenant.max_inflight,
            "retry_after_s": tenant.retry_after(now),
            "quota": None
            if quota is None
            else {
                "output_tokens_per_minute": int(quota.capacity),
                "left": int(quota.level),
                "retry_after_s": quota.retry_after(now),
            },
        }
    out[OTHER_TENANTS] = dict(other)
    return out
