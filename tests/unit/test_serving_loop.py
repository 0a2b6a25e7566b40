"""The event loop every server here runs on: uvloop, connecting to numeric addresses without a
resolver round trip on the thread pool; and the collector settled after start-up."""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
from typing import ClassVar

import aiohttp
import pytest
from aiohttp import web

from gateway.common.asgi_server import (
    YOUNG_GENERATION_THRESHOLD,
    NumericConnectLoop,
    _is_numeric,
    print_line,
    settle_garbage_collector,
)
from testbed.loopback import serving


class CountingLoop(NumericConnectLoop):
    """Counts the resolver calls uvloop's own ``sock_connect`` would make."""

    resolved: ClassVar[list[object]] = []

    async def getaddrinfo(self, host, port, **kwargs):  # type: ignore[no-untyped-def, override]
        CountingLoop.resolved.append(host)
        return await super().getaddrinfo(host, port, **kwargs)


def run(coro_fn) -> object:  # type: ignore[no-untyped-def]
    CountingLoop.resolved = []
    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        return runner.run(coro_fn())


def test_numeric_addresses_connect_without_the_resolver() -> None:
    host = "127.0.0.1"

    async def connect() -> bytes:
        async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"hello")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(greet, host, 0)
        port = server.sockets[0].getsockname()[1]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(sock=sock)
        data = await reader.read()
        writer.close()
        server.close()
        await server.wait_closed()
        return data

    assert run(connect) == b"hello"
    assert CountingLoop.resolved == []


@pytest.mark.parametrize(
    ("family", "host", "numeric"),
    [
        (socket.AF_INET, "127.0.0.1", True),
        (socket.AF_INET, "10.1.2.3", True),
        (socket.AF_INET6, "::1", True),
        (socket.AF_INET6, "fd00::1", True),
        (socket.AF_INET, "localhost", False),
        (socket.AF_INET, "vllm", False),
        (socket.AF_INET6, "127.0.0.1", False),
        (socket.AF_INET, "::1", False),
        (socket.AF_INET, None, False),
    ],
)
def test_which_addresses_skip_the_resolver(family: int, host: str | None, numeric: bool) -> None:
    assert _is_numeric(family, host) is numeric


def test_a_refused_connection_raises_connection_refused() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: refused

        async def connect() -> None:
            sock = socket.socket()
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            finally:
                sock.close()

        with pytest.raises(ConnectionRefusedError):
            run(connect)


def test_names_still_go_through_uvloops_resolver() -> None:
    async def connect() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("localhost", port))
        sock.close()
        server.close()
        await server.wait_closed()

    run(connect)
    assert CountingLoop.resolved == ["localhost"]


def test_aiohttp_requests_run_on_the_loop() -> None:
    """aiohttp connects through ``sock_connect`` (aiohappyeyeballs): the path the gateway's upstream
    client takes for every new connection, one per stream with llama-server."""

    async def fetch() -> list[str]:
        app = web.Application()

        async def ok(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/", ok)
        texts = []
        async with serving(app) as url, aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.get(f"{url}/", headers={"Connection": "close"}) as reply:
                    texts.append(await reply.text())
        return texts

    assert run(fetch) == ["ok", "ok", "ok"]
    assert CountingLoop.resolved == []


def test_start_up_objects_are_frozen_out_of_collections() -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    try:
        settle_garbage_collector()
        assert gc.get_freeze_count() > 1000  # this test process's modules, at least
        # The youngest generation is collected less often; the older ones keep their ratios.
        assert gc.get_threshold() == (YOUNG_GENERATION_THRESHOLD, before[1], before[2])
        garbage: list[object] = []
        garbage.append(garbage)  # a cycle made after start-up is still collected
        del garbage
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_cycle_made_while_serving_is_collected_without_an_explicit_collect() -> None:
    """With the raised threshold, cyclic garbage still goes: the collector runs on its own once enough
    objects were allocated."""
    before = gc.get_threshold()
    gc.unfreeze()
    try:
        settle_garbage_collector()
        collected = []

        class Node:
            def __init__(self) -> None:
                self.me = self

            def __del__(self) -> None:
                collected.append(True)

        Node()  # a cycle: reference counting alone never frees it
        assert not collected
        held = [[] for _ in range(2 * YOUNG_GENERATION_THRESHOLD)]  # tracked objects allocated and kept
        assert collected
        del held
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_an_announcement_is_one_write_with_its_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdout and stderr share one pipe under the tests and the demo: a line written in two parts can have
    a log line glued to it before its newline, and the "listening on" URL then runs into the log."""
    writes: list[str] = []

    class Recorder:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            writes.append("<flush>")

    monkeypatch.setattr(sys, "stdout", Recorder())
    print_line("sweetspot gateway listening on http://127.0.0.1:8080")
    assert writes == ["sweetspot gateway listening on http://127.0.0.1:8080\n", "<flush>"]
