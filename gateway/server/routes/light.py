"""Light routes: requests that generate nothing, sent to a healthy upstream without taking a permit.

* ``/tokenize``, ``/detokenize``, ``/v1/messages/count_tokens``: routed by the body's ``model`` (any healthy
  upstream when it names none), to the one with the most free permits.
* ``GET`` / ``DELETE /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``: to the upstream that created the
  response (:class:`~gateway.server.upstream.response_affinity.ResponseAffinity`). Without client keys, an id the
  gateway does not know (created before it started, or forgotten) is asked of each healthy upstream in turn,
  and the backend's own 404 is the answer when none has it. With keys, a stored response is the tenant's that
  created it: another tenant's id, or one the gateway does not know, is a 404 without asking any upstream.
  An id not of the form of :data:`~gateway.server.upstream.response_affinity.RESPONSE_ID` is a 400.
* The operator's ``passthrough_paths``: any method, passed on as they are. Nothing else of a backend is
  reachable, so its admin routes are never exposed by accident.

Auth, the drain and the client's error dialect apply as on the generation routes: a light request running when
the drain begins is counted (``DrainState.light``) and may finish, as a generation may.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from gateway.common.connection_loss import connection_loss
from gateway.server.parts import Gateway
from gateway.server.process.drain import shutting_down
from gateway.server.relay.request_watch import ClientGone
from gateway.server.routes.auth import unauthorized
from gateway.server.routes.errors import Dialect, error_response
from gateway.server.routes.inbound import BodyRefused, RequestHeaders, read_body
from gateway.server.routes.validation import model_not_found, with_model
from gateway.server.upstream.pool import Upstream
from gateway.server.upstream.response_affinity import RESPONSE_ID
from gateway.server.upstream.upstream_client import UpstreamFailed
from gateway.server.upstream.upstream_headers import request_headers

router = APIRouter()

LIGHT_TIMEOUT_S = 30.0  # a tokenizer or a stored response answers in milliseconds


class _Light:
    def __init__(self, request: Request, dialect: Dialect = Dialect.OPENAI) -> None:
        self.request = request
        self.gateway: Gateway = request.app.state.gateway
        self.dialect = dialect
        self.headers = RequestHeaders(request.scope["headers"], self.gateway.settings.priority_header)

    def refusal(self) -> Response | None:
        """The answer when this request may not go on: draining, or no valid key."""
        gateway = self.gateway
        if gateway.drain.draining:
            refusal = shutting_down()
            gateway.metrics.rejections.labels(refusal.reason).inc()
            response = error_response(
                refusal.status,
                str(refusal),
                reason=refusal.reason,
                retry_after_s=refusal.retry_after_s,
                dialect=self.dialect,
            )
            response.headers["connection"] = "close"
            return response
        if not gateway.tenants.authorized(self.headers.authorization, self.headers.api_key):
            return unauthorized(gateway.metrics, dialect=self.dialect)
        return None

    def candidates(self, eligible: list[str] | None) -> list[Upstream]:
        """Healthy upstreams among ``eligible`` (any, when None), the most free permits first."""
        pool = [u for u in self.gateway.pool if u.healthy and (eligible is None or u.name in eligible)]
        return sorted(pool, key=lambda u: u.limiter.free, reverse=True)

    async def send(self, upstream: Upstream, path: str, body: bytes | None) -> Response:
        gateway = self.gateway
        own_keys = gateway.tenants.requires_key
        headers = request_headers(
            gateway.settings.upstream_api_key,
            None if own_keys else self.headers.authorization,
            self.headers.request_id or "",
            stream=False,
            api=self.headers.api,
            api_key=None if own_keys else self.headers.api_key,
        )
        if not self.headers.request_id:
            del headers["x-request-id"]
        query = self.request.url.query
        try:
            status, content_type, payload = await gateway.client.forward(
                self.request.method,
                upstream.url,
                path + (f"?{query}" if query else ""),
                body,
                headers,
                name=upstream.public_name,
                timeout_s=LIGHT_TIMEOUT_S,
            )
        except UpstreamFailed as exc:
            if exc.connect_failed:
                upstream.mark_down(str(exc))
            return error_response(502, f"upstream failure: {exc}", code="upstream_unavailable", dialect=self.dialect)
        return Response(payload, status_code=status, media_type=content_type)

    async def body(self) -> bytes | Response:
        """The body, read as the generation routes read theirs (bounded, timed unless the front door saw it
        arrive whole), or the refusal."""
        settings = self.gateway.settings
        try:
            return await read_body(
                self.request.receive,
                limit=settings.max_body_bytes,
                declared_length=self.headers.content_length,
                timeout_s=settings.request_read_timeout_s,
                budget=self.gateway.queue,
                loss=connection_loss(self.request.scope),
            )
        except ClientGone:
            self.gateway.metrics.rejections.labels("client_disconnected").inc()
            return Response(status_code=499)
        except BodyRefused as exc:
            self.gateway.metrics.rejections.labels(exc.reason).inc()
            response = error_response(
                exc.status, str(exc), reason=exc.reason, retry_after_s=exc.retry_after_s, dialect=self.dialect
            )
            response.headers["connection"] = "close"  # the rest of the body is not read
            return response


async def _counted(request: Request, work: Awaitable[Response]) -> Response:
    """Run one light request, counted among the requests the drain lets finish until it is answered."""
    drain = request.app.state.gateway.drain
    drain.light += 1
    try:
        return await work
    finally:
        drain.light -= 1


async def _admitted(request: Request, dialect: Dialect = Dialect.OPENAI) -> tuple[_Light, bytes] | Response:
    """The request and its body, or the answer when it may not go on (draining, no key, too large)."""
    light = _Light(request, dialect)
    refused = light.refusal()
    if refused is not None:
        return refused
    body = await light.body()
    return body if isinstance(body, Response) else (light, body)


async def _by_model(request: Request, dialect: Dialect = Dialect.OPENAI) -> Response:
    admitted = await _admitted(request, dialect)
    if isinstance(admitted, Response):
        return admitted
    light, body = admitted
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        return error_response(400, "request body is not valid JSON", code="invalid_json", dialect=dialect)
    model = parsed.get("model") if isinstance(parsed, dict) else None
    eligible: list[str] | None = None
    if isinstance(model, str):
        resolved = light.gateway.pool.resolve(model)
        if not resolved.eligible and light.gateway.pool.upstreams:  # none at all: the 503 below
            return error_response(404, model_not_found(model, resolved.served), code="model_not_found", dialect=dialect)
        eligible = resolved.eligible
        if resolved.served != model:  # an alias or the default: the served name goes upstream
            body = with_model(body, resolved.served)
    upstreams = light.candidates(eligible)
    if not upstreams:
        return error_response(
            503, "no healthy upstream serves this request", reason="no_upstream", retry_after_s=2, dialect=dialect
        )
    return await light.send(upstreams[0], request.url.path, body)


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    return await _counted(request, _by_model(request))


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    return await _counted(request, _by_model(request))


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    return await _counted(request, _by_model(request, Dialect.ANTHROPIC))


async def _stored(request: Request, response_id: str, action: str = "") -> Response:
    admitted = await _admitted(request)
    if isinstance(admitted, Response):
        return admitted
    light, body = admitted
    if RESPONSE_ID.fullmatch(response_id) is None:
        return error_response(
            400,
            "a response id is 1 to 128 letters, digits, '_' or '-'",
            code="invalid_request",
            param="response_id",
        )
    not_found = error_response(
        404, f"no response with id {response_id!r}", code="response_not_found", param="response_id"
    )
    responses = light.gateway.responses
    tenant = light.gateway.tenants.identify(light.headers.authorization, light.headers.api_key)
    owner = responses.upstream_of(response_id, tenant)
    if owner is None and responses.owned:
        return not_found  # another tenant's, or one this gateway did not see created: nobody's to this tenant
    upstreams = light.candidates(None) if owner is None else [u for u in light.gateway.pool if u.name == owner]
    path = f"/v1/responses/{response_id}{action}"  # built from the checked id, never from the request's path
    answer: Response | None = None
    for upstream in upstreams:
        answer = await light.send(upstream, path, body or None)
        if answer.status_code != 404:
            if owner is None and answer.status_code < 400:
                responses.remember(response_id, upstream.name, tenant)
            return answer
    return answer or not_found


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    return await _counted(request, _stored(request, response_id))


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    return await _counted(request, _stored(request, response_id))


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str) -> Response:
    return await _counted(request, _stored(request, response_id, "/cancel"))


def add_passthrough(app: FastAPI, paths: list[str]) -> None:
    """Route each operator-listed path, any method, to a healthy upstream as it is."""

    async def passthrough(request: Request) -> Response:
        return await _counted(request, _passed(request))

    async def _passed(request: Request) -> Response:
        admitted = await _admitted(request)
        if isinstance(admitted, Response):
            return admitted
        light, body = admitted
        upstreams = light.candidates(None)
        if not upstreams:
            return error_response(503, "no healthy upstream", reason="no_upstream", retry_after_s=2)
        return await light.send(upstreams[0], request.url.path, body or None)

    for path in paths:
        app.add_api_route(path, passthrough, methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
