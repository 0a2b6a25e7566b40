"""Serve an ASGI app under uvicorn (uvloop + httptools) and announce where it listens: the gateway,
the simulator and the benchmarks' floor are all served this way, so they share one server stack.

The socket is bound before uvicorn starts, so ``port=0`` works: the kernel picks a free port and the
announcement line (``<name> listening on http://HOST:PORT``) carries it. Tests, benchmarks and the
demo start servers with ``--port 0`` and read the URL from that line.

Every server here runs on :class:`NumericConnectLoop` (uvloop, without a resolver thread hop for
numeric addresses) and freezes its start-up heap out of the garbage collector once it is ready.

A server given a ``drain`` coroutine drains on the first SIGTERM or SIGINT (:class:`DrainingServer`): it
keeps serving while ``drain`` runs (the gateway answers new requests 503 and lets running ones finish),
then shuts down and exits 0. A second signal stops it at once, except in a supervised worker
(``serve --workers``), which drains on the first SIGTERM or SIGINT whoever sends it and ignores more: the
same stop reaches it twice (systemd signals every process of the unit, and the parent forwards its own
signal too). Its parent says "stop at once" with SIGQUIT.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from types import FrameType

import uvicorn
import uvloop
from starlette.types import ASGIApp

log = logging.getLogger("sweetspot.serving")


def print_line(line: str) -> None:
    """Write ``line`` and its newline to stdout in one write, flushed. ``print`` writes the text and its end
    separately, and a process started with stdout and stderr on one pipe (tests, the demo) can then read a log
    line glued to the announcement before its newline: the "listening on" URL would run into it."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def listen_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on ``host:port``; ``reuse_port`` lets several processes listen on one port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(4096)
    return sock


def shown_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining on the first SIGTERM/SIGINT before it shuts down (see the module docstring).

    The signal is not re-raised once the server has stopped (uvicorn's default), so a drained gateway
    exits 0. ``supervised`` (a worker of ``serve --workers``): a repeated SIGTERM/SIGINT is ignored, and
    SIGQUIT (its parent's second signal) stops it at once."""

    def __init__(
        self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]], *, supervised: bool = False
    ) -> None:
        super().__init__(config)
        self._drain = drain
        self._supervised = supervised
        self._signalled = False
        self._draining: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        if self._supervised:
            signal.signal(signal.SIGQUIT, self._stop_now)
        await super().serve(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or not self.started:
            super().handle_exit(sig, frame)  # during start-up: nothing to drain, stop now
        elif not self._signalled:
            self._signalled = True
            self._loop.call_soon_threadsafe(self._start_drain)
        elif self._supervised:
            self._loop.call_soon_threadsafe(log.info, "already draining: signal %d ignored", sig)
        else:
            super().handle_exit(sig, frame)  # a second signal: stop now

    def _stop_now(self, sig: int, frame: FrameType | None) -> None:
        """SIGQUIT from a worker's parent: shut down without waiting for running requests (exits by SIGTERM)."""
        super().handle_exit(signal.SIGTERM, frame)
        self.force_exit = True

    def _start_drain(self) -> None:
        if self._draining is None:
            log.info("draining: new requests get 503, running ones may finish")
            self._draining = asyncio.ensure_future(self._drain())
            self._draining.add_done_callback(self._drained)

    def _drained(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("drain failed", exc_info=task.exception())
        self.should_exit = True


def serve_app(
    app: ASGIApp,
    *,
    name: str,
    host: str,
    port: int,
    log_level: str = "info",
    banner: Callable[[], str] | None = None,
    http: type[asyncio.Protocol] | str = "httptools",
    drain: Callable[[], Awaitable[None]] | None = None,
    sock: socket.socket | None = None,
    ready: Callable[[], object] | None = None,
    logging_configured: bool = False,
    supervised: bool = False,
) -> None:
    """Serve until SIGINT/SIGTERM, printing ``{name} listening on http://HOST:PORT`` once ready. ``http`` is
    uvicorn's protocol (a class, for the gateway's front door); ``drain`` runs on the first signal. A worker
    passes its own listening ``sock`` and a ``ready`` hook instead: its parent announces the port; and it is
    ``supervised``: its parent's signals govern its drain (:class:`DrainingServer`).
    ``logging_configured``: the caller set up the root logger, so uvicorn's own lines (start-up, shutdown,
    errors) go through it, in its format, instead of through uvicorn's plain-text handlers."""
    if sock is None:
        sock = listen_socket(host, port)
    bound_port = sock.getsockname()[1]
    shown = shown_host(host)
    config = uvicorn.Config(
        app,
        http=http,
        loop="uvloop",
        lifespan="on",
        log_level=log_level,
        access_log=False,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=5,
        log_config=None if logging_configured else uvicorn.config.LOGGING_CONFIG,
    )
    server = uvicorn.Server(config) if drain is None else DrainingServer(config, drain, supervised=supervised)

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            settle_garbage_collector()
            if ready is not None:
                ready()
            else:
                if banner is not None:
                    print_line(banner())
                print_line(f"{name} listening on http://{shown}:{bound_port}")
        await task

    with asyncio.Runner(loop_factory=NumericConnectLoop) as runner:
        runner.run(main())
    sys.stdout.flush()


#: Allocations of tracked objects between two collections of the youngest generation, once start-up is over.
YOUNG_GENERATION_THRESHOLD = 10_000


def settle_garbage_collector() -> None:
    """Move everything alive after start-up out of the cyclic collector's sight (``gc.freeze``).

    Start-up leaves hundreds of thousands of long-lived objects (FastAPI, pydantic, prometheus-client,
    the gateway's own tables) that every older-generation collection walks again, while a request's
    own garbage is almost all freed by reference counting. Frozen, they are skipped (``python -m
    bench.overhead`` shows the CPU per streamed chunk it saves). Garbage made later is collected as before.

    The youngest generation is then collected every :data:`YOUNG_GENERATION_THRESHOLD` allocations instead of
    Python's 700: a request allocates a few hundred tracked objects (frames of its coroutines, futures, dicts)
    and frees nearly all of them by reference counting, so at 700 a young collection ran every request or two
    and walked objects that were about to be freed anyway. The older generations keep Python's ratios.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, older, oldest)


class NumericConnectLoop(uvloop.Loop):
    """uvloop's loop, connecting sockets to numeric addresses without a resolver round trip.

    ``uvloop.Loop.sock_connect`` resolves every address through ``getaddrinfo`` on libuv's thread pool,
    even ``127.0.0.1``: a thread hop per new connection. aiohttp connects through it, and llama-server
    closes the connection after every streamed reply, so each stream would pay the hop on the way to its
    first token. For a numeric address this connects the way asyncio's own loop does (a
    non-blocking ``connect``, then wait until writable); names still go through uvloop.
    """

    async def sock_connect(self, sock: socket.socket, address: tuple) -> None:  # type: ignore[override]
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or not _is_numeric(sock.family, address[0]):
            await super().sock_connect(sock, address)
            return
        try:
            sock.connect(address)
            return
        except (BlockingIOError, InterruptedError):
            pass
        connected = self.create_future()
        fd = sock.fileno()

        def writable() -> None:
            if not connected.done():
                connected.set_result(None)

        self.add_writer(fd, writable)
        try:
            await connected
        finally:
            self.remove_writer(fd)
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            raise OSError(error, f"Connect call failed {address}")


def _is_numeric(family: int, host: object) -> bool:
    try:
        socket.inet_pton(family, host)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    return True
