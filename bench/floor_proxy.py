"""The floor of sweetspot's stack: a bare ASGI pass-through on the same parts (uvicorn with httptools and
uvloop, one aiohttp session upstream), with nothing of the gateway's own (no validation, queue, limiter,
measurement, metrics or FastAPI).

``bench/overhead.py`` measures it beside the gateway in the same run, so the gateway's own cost is the
difference between the two, and what the stack itself costs on the machine is on the record. Not a
product: it forwards POST bodies and streams answers back, nothing else.

    python -m bench.floor_proxy UPSTREAM_URL      # prints "floor listening on http://127.0.0.1:PORT"

``--server granian`` serves the same app under granian (a Rust HTTP server running ASGI apps) instead of
uvicorn, so the two servers are measured under one app (issue #37, "the floor itself"); ``--app gateway``
serves the gateway's own app (``create_server_app``) under granian: measurement only, with none of the
gateway's front door (no connection cap, head limit or head timeout of ``front_door.py``, no drain on
SIGTERM). Both print "<name> listening on http://127.0.0.1:PORT" as the uvicorn floor does:

    python -m bench.floor_proxy --server granian UPSTREAM_URL                # floor-granian
    python -m bench.floor_proxy --server granian --app gateway UPSTREAM_URL  # gateway-granian (SWEETSPOT_* env)

granian (an optional, bench-only dependency: the ``bench`` extra) runs one worker process beside its main
process, on uvloop with the gateway's :class:`NumericConnectLoop`, the ``asgi`` interface (with lifespan),
and the start-up heap frozen out of the garbage collector once the app has started, as ``serve_app`` does:
only the server differs. Its CPU is the two processes' together (``bench/overhead.py`` sums a process tree).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable

import aiohttp
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.common.asgi_server import (  # (the gateway's own uvicorn settings)
    NumericConnectLoop,
    listen_socket,
    print_line,
    serve_app,
    settle_garbage_collector,
)


class FloorProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        stream = b'"stream":true' in body.replace(b" ", b"")
        # The same choice the gateway makes: llama-server closes a connection after every stream.
        headers = {"Content-Type": "application/json", **({"Connection": "close"} if stream else {})}
        assert self.session is not None
        async with self.session.post(self.upstream + scope["path"], data=body, headers=headers) as reply:
            content_type = reply.headers.get("Content-Type", "application/json").encode()
            await send(
                {"type": "http.response.start", "status": reply.status, "headers": [(b"content-type", content_type)]}
            )
            async for data in reply.content.iter_any():
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


class Announced:
    """``app``, printing "``name`` listening on http://HOST:PORT" once it accepts connections (and freezing the
    start-up heap once its lifespan has started, as ``serve_app`` does): granian announces no port of its own,
    and the bench waits for this line."""

    def __init__(self, app: ASGIApp, name: str, host: str, port: int) -> None:
        self.app = app
        self.name, self.host, self.port = name, host, port
        self._announcing: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def announcing(message: Message) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                settle_garbage_collector()
                self._announcing = asyncio.get_running_loop().create_task(self._announce())

        await self.app(scope, receive, announcing)

    async def _announce(self) -> None:
        # granian starts serving after the lifespan has started: wait until a connection is accepted.
        for _ in range(600):
            try:
                _, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            print_line(f"{self.name} listening on http://{self.host}:{self.port}")
            return
        print_line(f"{self.name}: nothing accepted connections on {self.host}:{self.port} within 30 s")


def gateway_app(upstream: str) -> ASGIApp:
    """The gateway's own app, as ``sweetspot serve`` builds it (settings from ``SWEETSPOT_*`` too), with none of
    its front door: for measuring the server under it, never for serving."""
    from gateway.server.app import create_server_app
    from gateway.server.process.logs import configure_logging
    from gateway.settings import load_settings

    settings = load_settings(upstreams=[upstream])
    configure_logging(settings.log_level, settings.log_format, access_log=settings.access_log)
    return create_server_app(settings)


def serve_granian(
    build: Callable[[], ASGIApp],
    *,
    name: str,
    host: str = "127.0.0.1",
    runtime_mode: str = "auto",
    task_impl: str = "asyncio",
) -> None:
    """Serve ``build()`` under granian (one worker process, the ``asgi`` interface, uvloop) until SIGINT/SIGTERM.

    The app is built in the worker (after the fork), as granian loads its targets. granian binds the port
    itself and announces port 0 as 0, so a free port is picked here first (a moment's race: a bench, not a
    product)."""
    from granian import Granian, loops
    from granian.constants import Interfaces, Loops, RuntimeModes, TaskImpl
    from granian.log import LogLevels

    # The uvicorn floor's loop, so only the HTTP server differs. Registered under granian's "uvloop" name in
    # this process; the worker is forked (Linux, Python < 3.14) and inherits it.
    @loops.register("uvloop", packages=["uvloop"])
    def numeric_connect_loop(uvloop: object) -> NumericConnectLoop:
        loop = NumericConnectLoop()
        asyncio.set_event_loop(loop)
        return loop

    probe = listen_socket(host, 0)
    port = probe.getsockname()[1]
    probe.close()
    server = Granian(
        "bench.floor_proxy:app",  # shown in granian's process title only: the loader below builds the app
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        workers=1,
        loop=Loops.uvloop,
        backlog=4096,  # uvicorn's listen backlog in serve_app
        log_level=LogLevels.warning,
        websockets=False,
        runtime_mode=RuntimeModes(runtime_mode),
        task_impl=TaskImpl(task_impl),
    )
    server.serve(target_loader=lambda *args, **kwargs: Announced(build(), name, host, port), wrap_loader=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("upstream", help="OpenAI-compatible base URL to forward to")
    parser.add_argument("--server", choices=("uvicorn", "granian"), default="uvicorn")
    parser.add_argument(
        "--app",
        choices=("floor", "gateway"),
        default="floor",
        help="floor: the bare pass-through; gateway: the gateway's app, without its front door (granian only)",
    )
    parser.add_argument(
        "--runtime-mode",
        choices=("auto", "st", "mt"),
        default="auto",
        help="granian's Rust runtime: single- or multi-threaded (auto: mt for ASGI)",
    )
    parser.add_argument(
        "--task-impl", choices=("asyncio", "rust"), default="asyncio", help="granian's task implementation"
    )
    args = parser.parse_args(argv)
    if args.app == "gateway" and args.server != "granian":
        parser.error("--app gateway is for --server granian (on uvicorn, run `sweetspot serve`)")
    upstream: str = args.upstream
    if args.server == "uvicorn":
        serve_app(FloorProxy(upstream), name="floor", host="127.0.0.1", port=0, log_level="warning")
    elif args.app == "floor":
        serve_granian(
            lambda: FloorProxy(upstream), name="floor-granian", runtime_mode=args.runtime_mode, task_impl=args.task_impl
        )
    else:
        serve_granian(
            lambda: gateway_app(upstream),
            name="gateway-granian",
            runtime_mode=args.runtime_mode,
            task_impl=args.task_impl,
        )


if __name__ == "__main__":
    main()
