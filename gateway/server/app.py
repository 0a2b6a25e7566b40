"""``create_app(settings)``: builds the gateway's parts and wires them into a FastAPI app;
``create_server_app`` puts the proxied routes' fast path in front of it, which is what the server runs.

No request logic lives here; the routes are in ``gateway.server.routes``, the parts in ``gateway.server.parts`` and the
background loops in ``gateway.server.process.loops``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from gateway import __version__
from gateway.server.feedback.control_loop import ControlLoop
from gateway.server.feedback.membership import Membership
from gateway.server.parts import Gateway
from gateway.server.process.loops import every
from gateway.server.routes import light as light_routes
from gateway.server.routes import ops as ops_routes
from gateway.server.routes import proxied as proxied_routes
from gateway.server.routes.errors import error_response
from gateway.server.upstream.health import health_tick
from gateway.settings import Settings
from gateway.telemetry.loop_lag import LoopLagProbe
from gateway.telemetry.nvml import GpuSource

log = logging.getLogger("sweetspot.upstreams")


def create_app(
    settings: Settings,
    *,
    gateway: Gateway | None = None,
    gpu_source: GpuSource | None = None,
    reread: Callable[[], list[str]] | None = None,
) -> FastAPI:
    """The gateway app. ``gpu_source`` replaces NVML (tests without a GPU pass a fake); ``reread`` reads the
    configuration's ``upstreams`` again, for SIGHUP (None: only ``upstreams_file`` is read again)."""
    gateway = gateway or Gateway.build(settings)
    control_loop = ControlLoop.build(gateway, gpu_source)
    membership = Membership(gateway, control_loop, reread)
    loop_lag = LoopLagProbe(
        settings.event_loop_lag_interval_s, gateway.metrics.event_loop_lag, gateway.metrics.event_loop_lag_hist
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        poll = health_tick(gateway)
        await poll()  # know health and models before the first request
        for warning in gateway.pool.unlisted_targets():
            log.warning(warning)
        control_loop.start()
        await membership.start()  # the dns+ names' addresses join before the first request
        loops = [
            every(settings.health_interval_s, poll, "health poll"),
            every(settings.metrics_interval_s, control_loop.scrape, "backend scrape"),
            every(settings.nvml_interval_s, control_loop.read_gpus, "NVML read"),
            every(settings.event_loop_lag_interval_s, loop_lag.tick, "event-loop lag"),
            every(settings.discovery_interval_s, membership.tick, "upstream discovery"),
        ]
        if settings.control_enabled:  # an upstream that joins later gets a controller too
            loops.append(every(settings.control_interval_s, control_loop.control, "controller tick"))
        tasks = [asyncio.create_task(loop) for loop in loops]
        hangup = _on_sighup(membership, tasks)
        try:
            yield
        finally:
            if hangup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            tasks += [u.models_refresh for u in gateway.pool if u.models_refresh is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await control_loop.leave_board()
            control_loop.close()
            await gateway.client.close()

    app = FastAPI(title="sweetspot", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = gateway
    app.state.control_loop = control_loop
    app.state.membership = membership
    app.include_router(proxied_routes.router)
    app.include_router(light_routes.router)
    app.include_router(ops_routes.router)
    light_routes.add_passthrough(app, settings.passthrough_paths)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            message = f"unknown route: {request.method} {request.url.path}"
            return error_response(404, message, code="unknown_route")
        return error_response(exc.status_code, str(exc.detail), code="http_error")

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> Response:
        return error_response(500, "internal error in the gateway", code="internal_error")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(400, str(exc), code="invalid_request")

    return app


def _on_sighup(membership: Membership, tasks: list[asyncio.Task[None]]) -> bool:
    """SIGHUP re-reads the upstreams (:meth:`Membership.reload`); whether the handler is installed (only the main
    thread's loop can take signals: an app run elsewhere, as in some tests, has none)."""

    async def reload() -> None:
        await membership.reload()

    def hangup() -> None:
        task = asyncio.get_running_loop().create_task(reload())
        tasks[:] = [*(t for t in tasks if not t.done()), task]  # cancelled with the loops at shutdown
        task.add_done_callback(_log_failure)

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hangup)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


def _log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("SIGHUP: re-reading the upstreams failed", exc_info=task.exception())


def create_server_app(
    settings: Settings, *, reread: Callable[[], list[str]] | None = None
) -> proxied_routes.ProxiedRoutes:
    """What ``sweetspot serve`` runs: :func:`create_app` behind :class:`~gateway.server.routes.proxied.ProxiedRoutes`,
    which serves the proxied POST routes ahead of FastAPI's layers."""
    app = create_app(settings, reread=reread)
    return proxied_routes.ProxiedRoutes(app, app.state.gateway)
