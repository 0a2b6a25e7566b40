"""One generation request through the gateway, start to end: refuse what is bad cheaply, queue for a permit,
forward (failing over at most once), stream back or answer whole, measure, release.

Order of checks follows what is cheapest to refuse first (draining, auth, content type, size, JSON, fields,
model), so bad requests never take a queue place or an upstream slot. A request reaches an upstream at most
once: it fails over to another upstream, once, only when the first provably did not run it
(:mod:`gateway.server.upstream.upstream_client`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time

from starlette.responses import Response
from starlette.types import Receive, Scope

from gateway.common.connection_loss import connection_loss
from gateway.common.headers import QUEUE_HEADER_BYTES, put_header, queue_header_value
from gateway.control.window import Outcome
from gateway.server.admission.admission_queue import Permit
from gateway.server.admission.prompt_size import estimated_kv_tokens
from gateway.server.admission.refusals import AdmissionError, QueueTimeout, ShuttingDown
from gateway.server.admission.routing import RouteHint
from gateway.server.admission.tenants import Tenant
from gateway.server.parts import Gateway
from gateway.server.process.drain import shutting_down
from gateway.server.process.logs import access_enabled, log_access
from gateway.server.relay.event_streams import NamedEventFilter
from gateway.server.relay.measure import RequestTracker
from gateway.server.relay.request_watch import ClientGone, FirstTokenTimeout, RequestWatch, ServerShutdown, Stop
from gateway.server.relay.sse import SSEFilter, StreamWatcher
from gateway.server.relay.streaming import ProxyStreamResponse
from gateway.server.relay.whole_answer import AnswerTooLarge, answer_head, read_capped, whole_answer
from gateway.server.routes.auth import UNAUTHORIZED
from gateway.server.routes.errors import error_response, sse_error_event
from gateway.server.routes.inbound import BodyRefused, RequestHeaders, read_body
from gateway.server.routes.table import Route
from gateway.server.routes.validation import (
    BadRequest,
    field_of,
    model_not_found,
    parse_body,
    sequences,
    with_model,
    with_usage_requested,
)
from gateway.server.upstream.health import refresh_models
from gateway.server.upstream.pool import Upstream
from gateway.server.upstream.upstream_client import (
    UpstreamFailed,
    UpstreamReply,
    UpstreamTimeout,
)
from gateway.server.upstream.upstream_headers import request_headers

log = logging.getLogger("sweetspot.api")

# Seconds a client is told to wait after an upstream's own 503 that named no time (a model loading).
UPSTREAM_RETRY_AFTER_S = 1

#: Outcomes that say something about the upstream (its timeouts in a row are counted).
UPSTREAM_OUTCOMES = frozenset({Outcome.OK, Outcome.UPSTREAM_ERROR, Outcome.TIMED_OUT, Outcome.CLIENT_ERROR})


class Forward:
    """One proxied request. A class only to keep its many steps readable; it lives for one request."""

    def __init__(self, gateway: Gateway, scope: Scope, receive: Receive, route: Route) -> None:
        self.receive = receive
        self.connection_loss = connection_loss(scope)
        self.route = route
        self.gateway = gateway
        self.tracker = RequestTracker(arrived=self.gateway.clock(), clock=self.gateway.clock)
        self.headers = RequestHeaders(scope["headers"], self.gateway.settings.priority_header, gateway.tenants.header)
        self.tenant: Tenant | None = None
        # The gateway's own id goes upstream (vLLM makes it its request id): two clients, or two tenants, that
        # send the same X-Request-Id must not collide there. The client's is echoed back and logged beside it.
        self.request_id = secrets.token_hex(16)
        self.client_request_id = self.headers.request_id
        self.permit: Permit[Upstream] | None = None  # the permit held right now, for the last-resort clean-up
        self.slots = 1  # sequences the request runs (n x prompts): slots of the limit it holds
        self.refused: str | None = None  # the rejection reason, when the gateway refused it itself
        self.watch: RequestWatch | None = None

    @property
    def shown_request_id(self) -> str:
        """The X-Request-Id the client is answered with: its own when it sent one, else the gateway's."""
        return self.client_request_id or self.request_id

    def _answer(self, response: Response) -> Response:
        streams = isinstance(response, ProxyStreamResponse)
        if not streams:  # a stream is built with them, and logged when it ends
            put_header(response, b"x-request-id", self.shown_request_id)
            if self.permit is not None:
                put_header(response, QUEUE_HEADER_BYTES, queue_header_value(self.tracker.queue_wait))
            self._log_access(response.status_code)
        metrics = self.gateway.metrics
        metrics.child(metrics.requests, self.route.path, str(response.status_code), self.tracker.model).inc()
        return response

    def _log_access(self, status: int) -> None:
        if access_enabled():
            log_access(
                {
                    "event": "access",
                    "request_id": self.request_id,
                    "client_request_id": self.client_request_id,
                    "method": "POST",
                    "route": self.route.path,
                    "status": status,
                    "reason": self.refused,
                    **self.tracker.access_fields(),
                }
            )

    def _refuse(
        self,
        status: int,
        message: str,
        reason: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: int | None = None,
    ) -> Response:
        self.refused = reason
        self.gateway.metrics.rejections.labels(reason).inc()
        if self.tenant is not None:
            self.tenant.count_rejection(reason)
        return self._answer(
            error_response(
                status,
                message,
                code=code or reason,
                param=param,
                reason=reason,
                retry_after_s=retry_after_s,
                dialect=self.route.dialect,
            )
        )

    def _refuse_admission(self, refusal: AdmissionError) -> Response:
        response = self._refuse(refusal.status, str(refusal), refusal.reason, retry_after_s=refusal.retry_after_s)
        if isinstance(refusal, ShuttingDown):
            response.headers["connection"] = "close"  # a retry reconnects, landing on another replica
        return response

    async def run(self) -> Response:
        gateway = self.gateway
        settings = gateway.settings
        if gateway.drain.draining:
            return self._refuse_admission(shutting_down())
        tenant = gateway.tenants.identify(self.headers.authorization, self.headers.api_key, named=self.headers.tenant)
        if tenant is None:
            return self._refuse(401, "invalid or missing API key", UNAUTHORIZED, code="invalid_api_key")
        self.tenant = self.tracker.tenant = tenant
        tenant.count_request()
        if not self.headers.is_json:
            return self._refuse(
                415, "request bodies must be JSON (Content-Type: application/json)", "unsupported_media_type"
            )
        try:
            body = await read_body(
                self.receive,
                limit=settings.max_body_bytes,
                declared_length=self.headers.content_length,
                timeout_s=settings.request_read_timeout_s,
                budget=gateway.queue,
                loss=self.connection_loss,
            )
        except ClientGone:  # left while sending its body
            gateway.metrics.rejections.labels("client_disconnected").inc()
            return self._answer(Response(status_code=499))
        except BodyRefused as exc:
            response = self._refuse(exc.status, str(exc), exc.reason, retry_after_s=exc.retry_after_s)
            response.headers["connection"] = "close"  # the rest of the body is not read
            return response
        try:
            parsed = parse_body(self.route.schema, body)
            priority = self._priority(tenant)
            n = field_of(parsed, "n")
            if n is not None and n > settings.max_n:
                raise BadRequest(f"n: at most {settings.max_n} choices per request", param="n")
        except BadRequest as exc:
            return self._refuse(400, str(exc), "bad_request", code=exc.code or "invalid_request", param=exc.param)
        model: str = parsed.model  # type: ignore[attr-defined]
        resolved = gateway.pool.resolve(model)
        eligible = resolved.eligible
        if not eligible and not gateway.pool.upstreams:  # dns+ names not resolved yet: no model is known
            return self._refuse(
                503, "no upstream: the dns+ names configured have no address yet", "no_upstream", retry_after_s=2
            )
        if not eligible:
            return self._refuse(404, model_not_found(model, resolved.served), "model_not_found", param="model")
        self.slots = slots = sequences(parsed)
        widest = gateway.pool.widest_admitted(eligible, settings)
        if slots > widest:
            return self._refuse(
                400,
                f"this request runs {slots} sequences at once (n x prompts); the gateway admits at most {widest} "
                "per request: ask for fewer choices or send fewer prompts per request",
                "too_many_sequences",
                code="invalid_request",
                param="n" if n else "prompt",
            )
        self.tracker.requested_model = model
        self.tracker.served_model = resolved.served
        self.tracker.model = resolved.label  # a bounded label value from here on
        previous = field_of(parsed, "previous_response_id")
        if previous is not None:
            # A conversation continues where its state is: the upstream that created the previous response.
            # With client keys only its own tenant may continue it; any other id does not exist for this one.
            owner = gateway.responses.upstream_of(previous, tenant)
            if owner is None and gateway.responses.owned:
                return self._refuse(
                    404,
                    f"no response with id {previous[:130]!r}",
                    "response_not_found",
                    param="previous_response_id",
                )
            if owner is not None and owner in eligible:
                eligible = [owner]
        # Several upstreams could take it: the router weighs where its prompt's prefix is cached against load.
        hint = None
        if gateway.router is not None and len(eligible) > 1:
            adapter = resolved.served if gateway.pool.is_adapter(resolved.served) else None
            hint = gateway.router.hint(parsed, adapter)
        stream = bool(field_of(parsed, "stream")) and self.route.streams
        if resolved.served != model:  # an alias or the default: the served name goes upstream
            body = with_model(body, resolved.served)
        forward_usage = True
        if stream and self.route.asks_usage:
            options = parsed.stream_options  # type: ignore[attr-defined]
            forward_usage = bool(options and options.get("include_usage"))
            if not forward_usage:
                # Ask for usage so token counts are always known; the usage chunk is dropped on the way back.
                body = with_usage_requested(body, options)
        estimating = [up for up in map(gateway.pool.by_name.get, eligible) if up is not None and up.estimating_kv]
        # Where no footprint is measured yet, the KV cap counts this request's estimated size.
        kv_tokens = estimated_kv_tokens(parsed) if estimating else None
        if kv_tokens is not None:
            for upstream in estimating:
                upstream.admitting(kv_tokens)
        del parsed  # the request waits as its raw body (counted against max_queued_bytes), not as a parsed tree
        self.watch = watch = RequestWatch(self.receive, gateway.drain.running, self.connection_loss)
        handed_off = False
        try:
            permit = await self._admit(eligible, priority, watch, hint, len(body))
            response = await self._send(permit, eligible, body, stream, forward_usage, watch)
            handed_off = isinstance(response, ProxyStreamResponse)
            return self._answer(response)
        except AdmissionError as exc:
            return self._refuse_admission(exc)
        except ClientGone:
            return self._answer(Response(status_code=499))  # nobody reads it; counted for the metrics
        except ServerShutdown:
            return self._refuse_admission(shutting_down())
        except Exception:
            # A bug or an upstream failure nobody foresaw: the client still gets OpenAI's shape, and the
            # permit is returned (release and finish are idempotent).
            log.exception("request %s failed unexpectedly", self.request_id)
            if self.permit is not None:
                self._release(self.permit, Outcome.UPSTREAM_ERROR)
            return self._answer(
                error_response(500, "internal error in the gateway", code="internal_error", dialect=self.route.dialect)
            )
        finally:
            if not handed_off:
                watch.close()

    def _priority(self, tenant: Tenant) -> int:
        """The request's class: the tenant's own, or the one the header asks for, never above what it may."""
        raw = self.headers.priority
        if raw is None:
            return tenant.priority
        try:
            return self.gateway.tenants.asked_class(tenant, raw)
        except ValueError as exc:
            raise BadRequest(str(exc), param=self.gateway.settings.priority_header) from None

    async def _admit(
        self, eligible: list[str], priority: int, watch: RequestWatch, hint: RouteHint | None, nbytes: int
    ) -> Permit[Upstream]:
        """Wait for a permit; a client that leaves first raises ClientGone and never reaches an upstream."""
        gateway = self.gateway
        metrics = gateway.metrics
        waited_from = gateway.clock()
        level = gateway.tenants.classes[priority]
        try:
            permit = await watch.guard(
                gateway.queue.acquire(
                    tenant=self.tenant,
                    priority=priority,
                    eligible=eligible,
                    timeout_s=gateway.settings.queue_timeout_s,
                    hint=hint,
                    slots=self.slots,
                    nbytes=nbytes,
                )
            )
        except ClientGone:
            metrics.child(metrics.queue_wait, "client_gone", level).observe(gateway.clock() - waited_from)
            metrics.rejections.labels("client_disconnected").inc()
            raise
        except (AdmissionError, ServerShutdown) as exc:
            ended = "timed_out" if isinstance(exc, QueueTimeout) else "rejected"
            metrics.child(metrics.queue_wait, ended, level).observe(gateway.clock() - waited_from)
            raise
        self.permit = permit
        queue_wait = permit.admitted - waited_from
        metrics.child(metrics.queue_wait, "admitted", level).observe(queue_wait)
        self.tracker.admit(permit.target, permit.admitted, queue_wait)
        return permit

    async def _send(
        self,
        permit: Permit[Upstream],
        eligible: list[str],
        body: bytes,
        stream: bool,
        forward_usage: bool,
        watch: RequestWatch,
    ) -> Response:
        """Forward, failing over once to another upstream when the first provably did not run the request;
        owns ``permit`` until a streaming response takes it over."""
        gateway = self.gateway
        settings = gateway.settings
        self.tracker.streamed = stream
        # The client's own credential goes upstream only when the gateway holds no keys of its own.
        own_keys = gateway.tenants.requires_key
        authorization = None if own_keys else self.headers.authorization
        api_key = None if own_keys else self.headers.api_key
        gateway.metrics.overhead.observe(max(gateway.clock() - self.tracker.arrived - self.tracker.queue_wait, 0.0))
        # A stream's headers come before its first token: both are due within first_token_timeout_s of now (a
        # failover's too), under one timer, which the stream's response takes over and cancels at the first
        # token; nothing else bounds a stream until then. A whole answer's head is bounded with its body, by
        # upstream_timeout_s (aiohttp's total timeout).
        overdue: asyncio.TimerHandle | None = None
        if stream:
            overdue = asyncio.get_running_loop().call_later(
                settings.first_token_timeout_s, watch.stop, Stop.FIRST_TOKEN_TIMEOUT
            )
        failed_over = False
        try:
            while True:
                upstream = permit.target
                headers = request_headers(
                    settings.upstream_api_key,
                    authorization,
                    self.request_id,
                    stream=stream,
                    keep_alive=upstream.streams_keep_alive,
                    api=self.headers.api,
                    api_key=api_key,
                )
                self.tracker.switch(upstream)
                try:
                    reply = await watch.guard(
                        gateway.client.send(
                            upstream.url, self.route.path, body, headers, name=upstream.public_name, stream=stream
                        )
                    )
                except FirstTokenTimeout:
                    log.warning("request %s: no answer from %s in time", self.request_id, upstream.url)
                    return self._finish(permit, Outcome.TIMED_OUT, self._timeout_response(upstream))
                except ClientGone:
                    self._release(permit, Outcome.CLIENT_CANCELLED)
                    raise
                except ServerShutdown:
                    self._release(permit, Outcome.SHUT_DOWN)
                    raise
                except UpstreamFailed as exc:
                    if exc.connect_failed:
                        upstream.mark_down(str(exc))  # the health poll brings it back
                    if exc.model_missing:
                        refresh_models(gateway, upstream)  # its list is stale: the next request goes where it is listed
                    alternative = None
                    if exc.not_processed and not failed_over:
                        others = [name for name in eligible if name != upstream.name]
                        alternative = gateway.queue.try_acquire(others, permit.tenant, permit.slots) if others else None
                    if alternative is not None:
                        gateway.metrics.upstream_retries.labels(upstream.name, "failover").inc()
                        attempt = Outcome.CLIENT_ERROR if exc.model_missing else Outcome.UPSTREAM_ERROR
                        gateway.queue.release(permit, self.tracker.failed_attempt(gateway.metrics, attempt))
                        permit = self.permit = alternative
                        failed_over = True
                        continue
                    outcome = Outcome.CLIENT_ERROR if exc.model_missing else Outcome.UPSTREAM_ERROR
                    return self._finish(permit, outcome, self._upstream_failure(exc))
                except UpstreamTimeout as exc:
                    log.warning("request %s: %s (%s)", self.request_id, exc, upstream.url)
                    return self._finish(permit, Outcome.TIMED_OUT, self._timeout_response(upstream))
                if overdue is not None and reply.status == 200:
                    response = self._stream(permit, reply, forward_usage, watch, overdue)
                    overdue = None  # the stream's now
                    return response
                if overdue is not None:
                    overdue.cancel()  # an error's body, read under the silence bound
                    overdue = None
                return await self._buffered(permit, reply, watch)
        finally:
            if overdue is not None:
                overdue.cancel()

    def _timeout_response(self, upstream: Upstream) -> Response:
        return error_response(
            504, f"{upstream.public_name} did not answer in time", code="upstream_timeout", dialect=self.route.dialect
        )

    def _upstream_failure(self, exc: UpstreamFailed) -> Response:
        """The upstream failed before answering. An OpenAI-shaped error body of its own (llama-server's
        "Loading model", a 429) is passed on with its status; anything else becomes the gateway's 502/503.
        A 503 or 429 always carries Retry-After (the upstream's, else one the SDK waits out)."""
        if exc.model_missing and exc.body:  # the engine's own 404, as a client sending to it directly gets it
            return Response(exc.body, status_code=404, media_type="application/json")
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
            response = error_response(
                status, f"upstream failure: {exc}", code="upstream_unavailable", dialect=self.route.dialect
            )
        if response.status_code in (429, 503):
            response.headers["retry-after"] = exc.retry_after or str(UPSTREAM_RETRY_AFTER_S)
        return response

    def _stream(
        self,
        permit: Permit[Upstream],
        reply: UpstreamReply,
        forward_usage: bool,
        watch: RequestWatch,
        overdue: asyncio.TimerHandle,
    ) -> Response:
        route, clock = self.route, self.gateway.clock
        # One event is part of an answer: never more than a whole answer may be (max_response_bytes).
        bound = self.gateway.settings.max_response_bytes
        named = (
            None if route.events is None else NamedEventFilter(self.tracker, clock, route.events, max_event_bytes=bound)
        )
        sse: StreamWatcher = (
            named
            if named is not None
            else SSEFilter(self.tracker, clock, forward_usage=forward_usage, max_event_bytes=bound)
        )

        def done(outcome: Outcome) -> None:
            watch.close()
            if named is not None and route.remembers_responses and named.response_id is not None:
                self.gateway.responses.remember(named.response_id, permit.target.name, self.tenant)
            self._release(permit, outcome)
            self._log_access(reply.status)

        def error_event(message: str, code: str, status: int) -> bytes:
            return sse_error_event(message, code=code, status=status, dialect=route.dialect, named=route.named_events)

        return ProxyStreamResponse(
            reply,
            sse,
            request_id=self.shown_request_id,
            queue_seconds=self.tracker.queue_wait,
            watch=watch,
            overdue=overdue,
            on_done=done,
            error_event=error_event,
        )

    async def _buffered(self, permit: Permit[Upstream], reply: UpstreamReply, watch: RequestWatch) -> Response:
        limit = self.gateway.settings.max_response_bytes
        try:
            payload = reply.body if reply.body is not None else await watch.guard(read_capped(reply.response, limit))
        except ClientGone:
            reply.close()
            self._release(permit, Outcome.CLIENT_CANCELLED)
            raise
        except ServerShutdown:
            reply.close()
            self._release(permit, Outcome.SHUT_DOWN)
            raise
        except TimeoutError:
            reply.close()
            return self._finish(permit, Outcome.TIMED_OUT, self._timeout_response(permit.target))
        except AnswerTooLarge:
            reply.close()
            message = (
                f"{permit.target.public_name}'s answer is over the gateway's {limit}-byte bound for a whole answer: "
                "stream it (stream=true), or ask for fewer choices, tokens or logprobs"
            )
            return self._finish(
                permit,
                Outcome.OK,  # the upstream did its job; the answer is the gateway's to refuse
                error_response(502, message, code="response_too_large", dialect=self.route.dialect),
            )
        except Exception as exc:  # noqa: BLE001 (aiohttp.ClientError and friends: the body broke off, a 502)
            reply.close()
            return self._finish(
                permit,
                Outcome.UPSTREAM_ERROR,
                error_response(
                    502,
                    f"upstream failed while answering: {type(exc).__name__}",
                    dialect=self.route.dialect,
                    code="upstream_disconnected",
                ),
            )
        reply.release()
        status = reply.status
        outcome = Outcome.OK if status < 400 else Outcome.CLIENT_ERROR if status < 500 else Outcome.UPSTREAM_ERROR
        if status == 200:
            head = answer_head(payload)
            if head is not None:
                usage = self.route.usage(head)
                if usage is not None:
                    self.tracker.usage(usage)
                if self.route.remembers_responses and isinstance(head["id"], str):
                    self.gateway.responses.remember(head["id"], permit.target.name, self.tenant)
        content_type = reply.response.headers.get("content-type", "application/json")
        return self._finish(permit, outcome, whole_answer(payload, status, content_type))

    def _release(self, permit: Permit[Upstream], outcome: Outcome) -> None:
        gateway = self.gateway
        if not permit.released and outcome in UPSTREAM_OUTCOMES:
            permit.target.request_ended(
                outcome is Outcome.TIMED_OUT,
                now=time.monotonic(),
                timeouts_to_down=gateway.settings.upstream_timeouts_to_down,
                hold_s=gateway.settings.health_hold_s,
            )
        gateway.queue.release(permit, self.tracker.finish(outcome, gateway.metrics))

    def _finish(self, permit: Permit[Upstream], outcome: Outcome, response: Response) -> Response:
        self._release(permit, outcome)
        return response
