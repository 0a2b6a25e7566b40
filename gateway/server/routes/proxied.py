"""The OpenAI-compatible routes: validate, queue for a permit, forward, stream back, measure.

Order of checks follows what is cheapest to refuse first (draining, auth, content type, size, JSON, fields,
model), so bad requests never take a queue place or an upstream slot. A request reaches an upstream at most
once: it fails over to another upstream, once, only when the first provably did not run it
(:mod:`gateway.server.upstream_client`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.control.window import Outcome
from gateway.server.admission import AdmissionError, Permit
from gateway.server.drain import DRAIN_RETRY_AFTER_S
from gateway.server.errors import error_response
from gateway.server.measure import RequestTracker
from gateway.server.parts import Gateway
from gateway.server.request_watch import ClientGone, RequestWatch, ServerShutdown
from gateway.server.routes.auth import bearer_token, key_matches, raw_header, unauthorized
from gateway.server.routes.inbound import RequestHeaders, read_body
from gateway.server.routes.validation import (
    BadRequest,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    parse_body,
    with_usage_requested,
)
from gateway.server.sse import SSEFilter
from gateway.server.streaming import ProxyStreamResponse
from gateway.server.tenants import Tenant
from gateway.server.upstream_client import UpstreamFailed, UpstreamReply, UpstreamTimeout
from gateway.server.upstream_headers import request_headers
from gateway.server.upstreams import Upstream

router = APIRouter()
log = logging.getLogger("sweetspot.api")


@dataclass(frozen=True)
class Route:
    path: str
    schema: type[BaseModel]
    streams: bool


CHAT = Route("/v1/chat/completions", ChatRequest, True)
COMPLETIONS = Route("/v1/completions", CompletionRequest, True)
EMBEDDINGS = Route("/v1/embeddings", EmbeddingRequest, False)


async def chat_completions(request: Request) -> Response:
    return await _Forward(request.app.state.gateway, request.scope, request.receive, CHAT).run()


async def completions(request: Request) -> Response:
    return await _Forward(request.app.state.gateway, request.scope, request.receive, COMPLETIONS).run()


async def embeddings(request: Request) -> Response:
    return await _Forward(request.app.state.gateway, request.scope, request.receive, EMBEDDINGS).run()


# Registered in the FastAPI app so they are described in its OpenAPI document (the request body's schema is
# the validation model's) and answer a wrong method with 405; the POSTs themselves are served before routing
# by ProxiedRoutes.
for _route, _endpoint in ((CHAT, chat_completions), (COMPLETIONS, completions), (EMBEDDINGS, embeddings)):
    router.add_api_route(
        _route.path, _endpoint, methods=["POST"], response_class=Response,
        openapi_extra={"requestBody": {"required": True, "content": {
            "application/json": {"schema": _route.schema.model_json_schema()}}}},
    )

# Seconds a client is told to wait after an upstream's own 503 that named no time (a model loading).
UPSTREAM_RETRY_AFTER_S = 1

PROXIED = {route.path: route for route in (CHAT, COMPLETIONS, EMBEDDINGS)}

#: Outcomes that say something about the upstream (its timeouts in a row are counted).
UPSTREAM_OUTCOMES = frozenset({Outcome.OK, Outcome.UPSTREAM_ERROR, Outcome.TIMED_OUT, Outcome.CLIENT_ERROR})


class ProxiedRoutes:
    """The ASGI app the server runs: serves the proxied POST routes itself and hands everything else
    (other routes, wrong methods, the lifespan) to the FastAPI app.

    Why: every layer between the server and a handler costs each request a few calls and wraps ``send``
    (a streamed reply pays every wrapper once per chunk), and FastAPI puts five of them there; the hot
    routes skip all of them (``python -m bench.overhead`` measures the whole path; the README has the figures).
    Nothing is lost: :class:`_Forward` turns every exception into an OpenAI-shaped answer itself, and the
    same routes are registered in the FastAPI app too, so served either way they behave the same.
    """

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = PROXIED.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        response = await _Forward(self.gateway, scope, receive, route).run()
        await response(scope, receive, send)


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    denied = check_auth(gateway, raw_header(request.scope["headers"], b"authorization"))
    if denied is not None:
        return denied
    return JSONResponse({"object": "list", "data": gateway.pool.all_models()})


def check_auth(gateway: Gateway, authorization: bytes | None) -> Response | None:
    """401 unless the ``Authorization`` header carries one of the configured client keys (no keys: open)."""
    if not gateway.client_keys or key_matches(authorization, gateway.client_keys):
        return None
    gateway.metrics.rejections.labels("unauthorized").inc()
    return unauthorized()


class _Forward:
    """One proxied request. A class only to keep its many steps readable; it lives for one request."""

    def __init__(self, gateway: Gateway, scope: Scope, receive: Receive, route: Route) -> None:
        self.receive = receive
        self.route = route
        self.gateway = gateway
        self.tracker = RequestTracker(arrived=self.gateway.clock(), clock=self.gateway.clock)
        self.headers = RequestHeaders(scope["headers"], self.gateway.settings.priority_header, gateway.tenants.header)
        self.tenant: Tenant | None = None
        self.request_id = self.headers.request_id or secrets.token_hex(16)
        self.permit: Permit[Upstream] | None = None  # the permit held right now, for the last-resort clean-up
        self.watch: RequestWatch | None = None

    def _answer(self, response: Response) -> Response:
        if not isinstance(response, ProxyStreamResponse):  # a stream is built with it
            response.headers["x-request-id"] = self.request_id
        metrics = self.gateway.metrics
        metrics.child(metrics.requests, self.route.path, str(response.status_code)).inc()
        return response

    def _refuse(self, status: int, message: str, reason: str, *, code: str | None = None,
                param: str | None = None, retry_after_s: int | None = None) -> Response:
        self.gateway.metrics.rejections.labels(reason).inc()
        if self.tenant is not None:
            self.tenant.count_rejection(reason)
        return self._answer(error_response(status, message, code=code or reason, param=param, reason=reason,
                                           retry_after_s=retry_after_s))

    async def run(self) -> Response:
        gateway = self.gateway
        settings = gateway.settings
        if gateway.drain.draining:
            response = self._refuse(503, "the gateway is shutting down; retry (another replica will answer)",
                                    "shutting_down", retry_after_s=DRAIN_RETRY_AFTER_S)
            response.headers["connection"] = "close"
            return response
        tenant = gateway.tenants.identify(bearer_token(self.headers.authorization), self.headers.tenant)
        if tenant is None:
            gateway.metrics.rejections.labels("unauthorized").inc()
            return self._answer(unauthorized())
        self.tenant = self.tracker.tenant = tenant
        tenant.count_request()
        if not self.headers.is_json:
            return self._refuse(415, "request bodies must be JSON (Content-Type: application/json)",
                                "unsupported_media_type")
        try:
            async with asyncio.timeout(settings.request_read_timeout_s):
                body = await read_body(self.receive, limit=settings.max_body_bytes,
                                       declared_length=self.headers.content_length)
        except ClientGone:  # left while sending its body
            gateway.metrics.rejections.labels("client_disconnected").inc()
            return self._answer(Response(status_code=499))
        except TimeoutError:
            response = self._refuse(408, f"request body not received within {settings.request_read_timeout_s:g} s",
                                    "request_timeout")
            response.headers["connection"] = "close"
            return response
        if body is None:
            return self._refuse(413, f"request body exceeds {settings.max_body_bytes} bytes", "body_too_large")
        try:
            parsed = parse_body(self.route.schema, body)
            priority = self._priority(tenant)
            n = getattr(parsed, "n", None)
            if n is not None and n > settings.max_n:
                raise BadRequest(f"n: at most {settings.max_n} choices per request", param="n")
        except BadRequest as exc:
            return self._refuse(400, str(exc), "bad_request", code=exc.code or "invalid_request", param=exc.param)
        model: str = parsed.model  # type: ignore[attr-defined]
        eligible = gateway.pool.eligible(model)
        if not eligible:
            return self._refuse(404, f"the model `{model}` does not exist on any upstream", "model_not_found",
                                param="model")
        stream = bool(getattr(parsed, "stream", False)) and self.route.streams
        forward_usage = True
        if stream:
            options = parsed.stream_options  # type: ignore[attr-defined]
            forward_usage = bool(options and options.get("include_usage"))
            if not forward_usage:
                # Ask for usage so token counts are always known; the usage chunk is dropped on the way back.
                body = with_usage_requested(body, options)
        self.watch = watch = RequestWatch(self.receive, gateway.drain.running)
        handed_off = False
        try:
            permit = await self._admit(eligible, priority, watch)
            response = await self._send(permit, eligible, body, stream, forward_usage, watch)
            handed_off = isinstance(response, ProxyStreamResponse)
            return self._answer(response)
        except AdmissionError as exc:
            return self._refuse(exc.status, str(exc), exc.reason, retry_after_s=exc.retry_after_s)
        except ClientGone:
            return self._answer(Response(status_code=499))  # nobody reads it; counted for the metrics
        except ServerShutdown:
            return self._refuse(503, "the gateway is shutting down; retry (another replica will answer)",
                                "shutting_down", retry_after_s=DRAIN_RETRY_AFTER_S)
        except Exception:
            # A bug or an upstream failure nobody foresaw: the client still gets OpenAI's shape, and the
            # permit is returned (release and finish are idempotent).
            log.exception("request %s failed unexpectedly", self.request_id)
            if self.permit is not None:
                self._release(self.permit, Outcome.UPSTREAM_ERROR)
            return self._answer(error_response(500, "internal error in the gateway", code="internal_error"))
        finally:
            if not handed_off:
                watch.close()

    def _priority(self, tenant: Tenant) -> int:
        """The request's class: the tenant's own, or the one the header asks for, never above what it may."""
        raw = self.headers.priority
        if raw is None:
            return tenant.priority
        try:
            return tenant.class_for(self.gateway.tenants.class_index(raw))
        except ValueError as exc:
            raise BadRequest(str(exc), param=self.gateway.settings.priority_header) from None

    async def _admit(self, eligible: list[str], priority: int, watch: RequestWatch) -> Permit[Upstream]:
        """Wait for a permit; a client that leaves first raises ClientGone and never reaches an upstream."""
        gateway = self.gateway
        waited_from = gateway.clock()
        try:
            permit = await watch.guard(gateway.queue.acquire(
                tenant=self.tenant, priority=priority, eligible=eligible, timeout_s=gateway.settings.queue_timeout_s))
        except ClientGone:
            gateway.metrics.rejections.labels("client_disconnected").inc()
            raise
        self.permit = permit
        queue_wait = permit.admitted - waited_from
        gateway.metrics.queue_wait.observe(queue_wait)
        self.tracker.admit(permit.target, permit.admitted, queue_wait)
        return permit

    async def _send(self, permit: Permit[Upstream], eligible: list[str], body: bytes, stream: bool,
                    forward_usage: bool, watch: RequestWatch) -> Response:
        """Forward, failing over once to another upstream when the first provably did not run the request;
        owns ``permit`` until a streaming response takes it over."""
        gateway = self.gateway
        settings = gateway.settings
        self.tracker.streamed = stream
        # The client's own credential goes upstream only when the gateway holds no keys of its own.
        authorization = None if gateway.client_keys else self.headers.authorization
        gateway.metrics.overhead.observe(max(gateway.clock() - self.tracker.arrived - self.tracker.queue_wait, 0.0))
        # A stream's headers come before its first token: both are due within first_token_timeout_s of now.
        headers_timeout = settings.first_token_timeout_s if stream else settings.upstream_timeout_s
        first_token_deadline = asyncio.get_running_loop().time() + settings.first_token_timeout_s
        failed_over = False
        while True:
            upstream = permit.target
            headers = request_headers(settings.upstream_api_key, authorization, self.request_id, stream=stream,
                                      keep_alive=upstream.streams_keep_alive)
            self.tracker.switch(upstream)
            try:
                reply = await watch.guard(gateway.client.send(
                    upstream.url, self.route.path, body, headers, name=upstream.public_name, stream=stream,
                    headers_timeout_s=headers_timeout))
            except ClientGone:
                self._release(permit, Outcome.CLIENT_CANCELLED)
                raise
            except ServerShutdown:
                self._release(permit, Outcome.SHUT_DOWN)
                raise
            except UpstreamFailed as exc:
                if exc.connect_failed:
                    upstream.mark_down(str(exc))  # the health poll brings it back
                alternative = None
                if exc.not_processed and not failed_over:
                    others = [name for name in eligible if name != upstream.name]
                    alternative = gateway.queue.try_acquire(others, permit.tenant) if others else None
                if alternative is not None:
                    gateway.metrics.upstream_retries.labels(upstream.name, "failover").inc()
                    self.tracker.failed_attempt(gateway.metrics)
                    gateway.queue.release(permit)
                    permit = self.permit = alternative
                    failed_over = True
                    continue
                return self._finish(permit, Outcome.UPSTREAM_ERROR, self._upstream_failure(exc))
            except UpstreamTimeout as exc:
                log.warning("request %s: %s (%s)", self.request_id, exc, upstream.url)
                return self._finish(permit, Outcome.TIMED_OUT, self._timeout_response(upstream))
            if stream and reply.status == 200:
                return self._stream(permit, reply, forward_usage, watch, first_token_deadline)
            return await self._buffered(permit, reply, watch)

    @staticmethod
    def _timeout_response(upstream: Upstream) -> Response:
        return error_response(504, f"{upstream.public_name} did not answer in time", code="upstream_timeout")

    def _upstream_failure(self, exc: UpstreamFailed) -> Response:
        """The upstream failed before answering. An OpenAI-shaped error body of its own (llama-server's
        "Loading model", a 429) is passed on with its status; anything else becomes the gateway's 502/503.
        A 503 or 429 always carries Retry-After (the upstream's, else one the SDK waits out)."""
        response: Response | None = None
        if exc.status is not None and exc.body:
            try:
                payload = json.loads(exc.body)
            except ValueError:
                payload = None
            if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
                response = Response(exc.body, status_code=exc.status, media_type="application/json")
        if response is None:
            status = exc.status if exc.status in (429, 503) else 502
            response = error_response(status, f"upstream failure: {exc}", code="upstream_unavailable")
        if response.status_code in (429, 503):
            response.headers["retry-after"] = exc.retry_after or str(UPSTREAM_RETRY_AFTER_S)
        return response

    def _stream(self, permit: Permit[Upstream], reply: UpstreamReply, forward_usage: bool, watch: RequestWatch,
                first_token_deadline: float) -> Response:
        sse = SSEFilter(self.tracker, self.gateway.clock, forward_usage=forward_usage)

        def done(outcome: Outcome) -> None:
            watch.close()
            self._release(permit, outcome)

        return ProxyStreamResponse(reply, sse, request_id=self.request_id, watch=watch,
                                   first_token_deadline=first_token_deadline, on_done=done)

    async def _buffered(self, permit: Permit[Upstream], reply: UpstreamReply, watch: RequestWatch) -> Response:
        try:
            payload = await watch.guard(reply.response.read())
        except ClientGone:
            reply.close()
            self._release(permit, Outcome.CLIENT_CANCELLED)
            raise
        except ServerShutdown:
            reply.close()
            self._release(permit, Outcome.SHUT_DOWN)
            raise
        except asyncio.TimeoutError:
            reply.close()
            return self._finish(permit, Outcome.TIMED_OUT, self._timeout_response(permit.target))
        except Exception as exc:  # aiohttp.ClientError and friends: the body broke off
            reply.close()
            return self._finish(permit, Outcome.UPSTREAM_ERROR,
                                error_response(502, f"upstream failed while answering: {type(exc).__name__}",
                                               code="upstream_disconnected"))
        reply.response.release()
        status = reply.status
        outcome = Outcome.OK if status < 400 else Outcome.CLIENT_ERROR if status < 500 else Outcome.UPSTREAM_ERROR
        if status == 200:
            try:
                usage = json.loads(payload).get("usage")
            except (ValueError, AttributeError):
                usage = None
            if isinstance(usage, dict):
                self.tracker.usage(usage)
        content_type = reply.response.headers.get("content-type", "application/json")
        return self._finish(permit, outcome, Response(payload, status_code=status, media_type=content_type))

    def _release(self, permit: Permit[Upstream], outcome: Outcome) -> None:
        gateway = self.gateway
        if not permit.released and outcome in UPSTREAM_OUTCOMES:
            permit.target.request_ended(outcome is Outcome.TIMED_OUT, now=time.monotonic(),
                                        timeouts_to_down=gateway.settings.upstream_timeouts_to_down,
                                        hold_s=gateway.settings.health_hold_s)
        self.tracker.finish(outcome, gateway.metrics)
        gateway.queue.release(permit)

    def _finish(self, permit: Permit[Upstream], outcome: Outcome, response: Response) -> Response:
        self._release(permit, outcome)
        return response
