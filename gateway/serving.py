"""Serve an ASGI app under uvicorn (uvloop + httptools) and announce where it listens.

The socket is bound before uvicorn starts, so ``port=0`` works: the kernel picks a free port and the
announcement line (``<name> listening on http://HOST:PORT``) carries it. Tests, benchmarks and the
demo start servers with ``--port 0`` and read the URL from that line.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Callable

import uvicorn


def serve_app(app: object, *, name: str, host: str, port: int, log_level: str = "info",
              banner: Callable[[], str] | None = None) -> None:
    """Serve until SIGINT/SIGTERM, printing ``{name} listening on http://HOST:PORT`` once ready."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    bound_port = sock.getsockname()[1]
    shown_host = f"[{host}]" if family == socket.AF_INET6 else host
    config = uvicorn.Config(app, http="httptools", loop="uvloop", lifespan="on", log_level=log_level,
                            access_log=False, timeout_keep_alive=30, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            if banner is not None:
                print(banner(), flush=True)
            print(f"{name} listening on http://{shown_host}:{bound_port}", flush=True)
        await task

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        asyncio.run(main())
    sys.stdout.flush()
