"""The generation routes' entry point: :class:`ProxiedRoutes` serves their POSTs ahead of FastAPI, and each
request is a :class:`~gateway.server.routes.forward.Forward`. The routes are also registered in the FastAPI app,
for their OpenAPI description and a 405 on a wrong method; ``/v1/models`` lives here too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.server.parts import Gateway
from gateway.server.routes.auth import raw_header, unauthorized
from gateway.server.routes.forward import Forward
from gateway.server.routes.hosts import HOST_NOT_ALLOWED, host_refused, host_rule
from gateway.server.routes.table import PROXIED, ROUTES, Route

router = APIRouter()
log = logging.getLogger("sweetspot.api")


def _endpoint(route: Route) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await Forward(request.app.state.gateway, request.scope, request.receive, route).run()

    return endpoint


# Registered in the FastAPI app so they are described in its OpenAPI document (the request body's schema is
# the validation model's) and answer a wrong method with 405; the POSTs themselves are served before routing
# by ProxiedRoutes.
for _route in ROUTES:
    router.add_api_route(
        _route.path,
        _endpoint(_route),
        methods=["POST"],
        response_class=Response,
        name=_route.path.rsplit("/", 1)[-1],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _route.schema.model_json_schema()}},
            }
        },
    )


class ProxiedRoutes:
    """The ASGI app the server runs: serves the proxied POST routes itself and hands everything else
    (other routes, wrong methods, the lifespan) to the FastAPI app.

    Why: every layer between the server and a handler costs each request a few calls and wraps ``send``
    (a streamed reply pays every wrapper once per chunk), and FastAPI puts five of them there; the hot
    routes skip all of them (``python -m bench.overhead`` measures the whole path; the README has the
    figures). Nothing is lost: :class:`~gateway.server.routes.forward.Forward` turns every exception into an
    OpenAI-shaped answer itself, and the same routes are registered in the FastAPI app too, so served either
    way they behave the same.

    It checks the ``Host`` header first, on every route (:mod:`gateway.server.routes.hosts`).
    """

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway
        self.hosts = host_rule(gateway.settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hosts is not None and scope["type"] == "http":
            host = raw_header(scope["headers"], b"host")
            if not self.hosts.allows(host):
                self.gateway.metrics.rejections.labels(HOST_NOT_ALLOWED).inc()
                await host_refused(host)(scope, receive, send)
                return
        route = PROXIED.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        response = await Forward(self.gateway, scope, receive, route).run()
        await response(scope, receive, send)


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    headers = request.scope["headers"]
    if not gateway.tenants.authorized(raw_header(headers, b"authorization"), raw_header(headers, b"x-api-key")):
        return unauthorized(gateway.metrics)
    return JSONResponse({"object": "list", "data": gateway.pool.all_models()})
