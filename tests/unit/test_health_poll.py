"""The health poll against a real HTTP server on loopback whose ``/health`` misbehaves on cue.

An answer marks an upstream down at once; silence (a timeout, a dropped connection) only when it
repeats, and a connection dropped before any answer is resent once (a pooled connection the server
closed while it sat idle).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.control.window import SlidingWindow
from gateway.server.admission.limiter import Limiter
from gateway.server.upstream.health import SILENT_PROBES_TO_DOWN, check_health
from gateway.server.upstream.pool import Upstream
from testbed.loopback import serving

TIMEOUT_S = 0.3


class Script:
    """What ``/health`` does next: "ok", "loading" (503), "slow" (answers after the timeout), "drop"."""

    def __init__(self) -> None:
        self.next: list[str] = []
        self.calls = 0

    async def health(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        action = self.next.pop(0) if self.next else "ok"
        if action == "drop":
            assert request.transport is not None
            request.transport.close()  # the connection dies before any answer
            return web.Response()
        if action == "slow":
            await asyncio.sleep(TIMEOUT_S * 3)
        if action == "loading":
            return web.json_response({"error": {"message": "Loading model", "code": 503}}, status=503)
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


@pytest.fixture
async def server() -> AsyncIterator[tuple[Script, str]]:
    script = Script()
    app = web.Application()
    app.router.add_get("/health", script.health)
    app.router.add_get("/v1/models", script.models)
    async with serving(app) as url:
        yield script, url


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def upstream(url: str) -> Upstream:
    return Upstream(url=url, limiter=Limiter(url, 4), window=SlidingWindow(60.0))


async def poll(session: aiohttp.ClientSession, u: Upstream) -> None:
    await check_health(session, u, {}, TIMEOUT_S)


async def test_an_answer_marks_the_upstream_down_at_once_and_up_again(server, session) -> None:
    script, url = server
    u = upstream(url)
    script.next = ["loading"]
    await poll(session, u)
    assert not u.healthy and u.health_error == "/health answered 503"
    await poll(session, u)
    assert u.healthy and u.health_error is None and u.models == [{"id": "m", "object": "model"}]


async def test_one_unanswered_probe_keeps_a_serving_upstream_in_two_in_a_row_take_it_out(server, session) -> None:
    script, url = server
    u = upstream(url)
    script.next = ["slow"]
    await poll(session, u)
    assert u.healthy, "one late probe of a serving upstream must not refuse every request for a poll interval"
    assert u.health_error is not None and "TimeoutError" in u.health_error
    for _ in range(SILENT_PROBES_TO_DOWN - 1):
        script.next = ["slow"]
        await poll(session, u)
    assert not u.healthy
    await poll(session, u)  # the answer comes back
    assert u.healthy and u.health_error is None and u.silent_probes == 0


async def test_silence_never_brings_a_down_upstream_back(server, session) -> None:
    script, url = server
    u = upstream(url)
    script.next = ["loading", "slow"]
    await poll(session, u)
    await poll(session, u)
    assert not u.healthy


async def test_a_connection_dropped_before_the_answer_is_tried_again(server, session) -> None:
    script, url = server
    u = upstream(url)
    script.next = ["drop"]
    await poll(session, u)
    assert script.calls == 2
    assert u.healthy and u.health_error is None and u.silent_probes == 0


async def test_nothing_listening_marks_the_upstream_down_at_once(session) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    u = upstream(f"http://127.0.0.1:{port}")
    await poll(session, u)
    assert not u.healthy and "ClientConnectorError" in (u.health_error or "")


@pytest.mark.parametrize("read_health", [True, False])
async def test_the_backend_scraper_leaves_health_to_the_poll_when_told(server, read_health: bool) -> None:
    """The gateway's scrapers run beside its health poll: they do not GET /health a second time."""
    from gateway.telemetry.backends.scraper import BackendScraper

    script, url = server
    async with BackendScraper(url, kind="openai", read_health=read_health) as scraper:
        snapshot = await scraper.scrape()
    assert snapshot.error is None and snapshot.taken_at is not None
    assert script.calls == (1 if read_health else 0)
    assert snapshot.healthy is (True if read_health else None)
