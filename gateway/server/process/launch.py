"""``run`` is what ``sweetspot serve`` calls: settings in, the gateway served, in one process or, with
``workers`` > 1, in that many forked workers on one port (:mod:`gateway.server.process.workers`).

The serving itself (uvicorn on uvloop, the announcement line, the drain on the first signal) is the
shared :mod:`gateway.common.asgi_server`, which the simulator and the benchmarks' floor run too.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.common.asgi_server import listen_socket, print_line, serve_app, shown_host
from gateway.settings import Settings, load_settings


def run(config: Path | None = None, **flags: Any) -> None:
    """Build the gateway from settings (flags, env, TOML) and serve it until SIGINT/SIGTERM; with
    ``workers`` > 1, in that many worker processes on one port (:mod:`gateway.server.process.workers`)."""
    settings = load_settings(config, **flags)

    def reread() -> list[str]:  # SIGHUP: the configuration's upstreams, from the same flags, env and TOML file
        return load_settings(config, **flags).upstreams

    if settings.algorithm is not None:
        from gateway.server.feedback.algorithm_path import load_factory

        load_factory(settings.algorithm)(settings.initial_limit)  # a bad path ends here, before any worker starts
    if settings.workers == 1:
        _serve_gateway(settings, reread=reread)
        return
    from gateway.server.process.workers import READY, reserve_port, run_workers

    reserved, port = reserve_port(settings.host, settings.port)
    settings = settings.model_copy(update={"port": port})

    def worker(index: int, ready_fd: int) -> None:
        reserved.close()
        sock = listen_socket(settings.host, port, reuse_port=True)
        _serve_gateway(settings, sock=sock, ready=lambda: os.write(ready_fd, READY), supervised=True, reread=reread)

    def announce() -> None:
        listed = ", ".join(
            [*settings.upstreams, *([f"those of {settings.upstreams_file}"] if settings.upstreams_file else [])]
        )
        print_line(f"upstreams: {listed}; workers: {settings.workers}")
        print_line(f"sweetspot gateway listening on http://{shown_host(settings.host)}:{port}")

    status = run_workers(settings.workers, worker, announce=announce)
    reserved.close()
    if status:
        raise SystemExit(status)


def _serve_gateway(
    settings: Settings,
    *,
    sock: socket.socket | None = None,
    ready: Callable[[], object] | None = None,
    supervised: bool = False,
    reread: Callable[[], list[str]] | None = None,
) -> None:
    from gateway.server.app import create_server_app
    from gateway.server.process.drain import drain
    from gateway.server.process.front_door import FrontDoorLimits, guarded_protocol
    from gateway.server.process.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format, access_log=settings.access_log)
    app = create_server_app(settings, reread=reread)
    rejections = app.gateway.metrics.rejections
    limits = FrontDoorLimits(
        max_connections=settings.max_connections,
        max_header_bytes=settings.max_header_bytes,
        read_timeout_s=settings.request_read_timeout_s,
        on_refusal=lambda reason: rejections.labels(reason).inc(),
    )
    serve_app(
        app,
        name="sweetspot gateway",
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        banner=lambda: f"upstreams: {', '.join(upstream.url for upstream in app.gateway.pool)}",
        http=guarded_protocol(limits),
        drain=lambda: drain(app.gateway, settings.drain_timeout_s),
        sock=sock,
        ready=ready,
        logging_configured=True,
        supervised=supervised,
    )
