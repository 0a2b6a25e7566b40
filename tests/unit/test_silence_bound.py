"""The bound on a stream's silence (``gateway.server.upstream.silence``), against a real HTTP peer on loopback:
it never ends a stream that keeps sending, even to a reader that is not reading, nor one whose bytes wait unread
behind a slow reader; it ends a silent one between the bound and 1.25 times it, and does nothing once cancelled
or once the body has ended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.server.upstream.silence import LOOKS_PER_BOUND, SilenceBound, StreamSilent
from testbed.loopback import serving

BOUND_S = 0.2


async def _paced(request: web.Request) -> web.StreamResponse:
    """``count`` chunks ``every`` seconds apart, then silence for ``hang`` seconds, then the end."""
    every, count = float(request.query["every"]), int(request.query["count"])
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(count):
        await response.write(b"x" * 16)
        await asyncio.sleep(every)
    await asyncio.sleep(float(request.query.get("hang", "0")))
    await response.write_eof()
    return response


async def _burst(request: web.Request) -> web.StreamResponse:
    """``kib`` KiB at once (past aiohttp's read buffer, so the client pauses reading), silence, then the end."""
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"x" * 1024 * int(request.query["kib"]))
    await asyncio.sleep(float(request.query["hang"]))
    await response.write_eof()
    return response


@pytest.fixture
async def url() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/paced", _paced)
    app.router.add_get("/burst", _burst)
    async with serving(app) as base:
        yield f"{base}/paced"


async def _read_all(response: aiohttp.ClientResponse) -> int:
    return sum([len(data) async for data in response.content.iter_any()])


async def test_a_stream_that_keeps_sending_is_never_ended(url: str) -> None:
    """Chunks every 0.05 s for 0.8 s, four times the bound: read whole."""
    async with aiohttp.ClientSession() as session, session.get(url, params={"every": "0.05", "count": "16"}) as r:
        bound = SilenceBound(r.content, BOUND_S)
        assert await _read_all(r) == 16 * 16
        bound.cancel()


async def test_a_reader_that_does_not_read_is_no_silence_of_the_upstream(url: str) -> None:
    """The relay may be slow to read (a slow client behind it): bytes received count, read or not."""
    async with aiohttp.ClientSession() as session, session.get(url, params={"every": "0.05", "count": "12"}) as r:
        bound = SilenceBound(r.content, BOUND_S)
        await asyncio.sleep(0.5)  # nothing read for 2.5 bounds while the upstream sends
        assert await _read_all(r) == 12 * 16
        bound.cancel()


async def test_bytes_the_relay_has_not_read_are_no_silence(url: str) -> None:
    """The upstream sends more than the client's buffer holds, then nothing, while the relay (behind a slow
    client) reads nothing for three bounds: what waits unread is not the upstream's silence. The relay then
    reads it all and the body ends."""
    burst = url.replace("/paced", "/burst")
    params = {"kib": "512", "hang": str(BOUND_S * 2)}
    async with aiohttp.ClientSession() as session, session.get(burst, params=params) as r:
        bound = SilenceBound(r.content, BOUND_S)
        await asyncio.sleep(BOUND_S * 3)
        assert r.content.exception() is None
        assert await _read_all(r) == 512 * 1024
        bound.cancel()


async def test_a_silent_stream_ends_between_the_bound_and_a_quarter_past_it(url: str) -> None:
    params = {"every": "0.01", "count": "2", "hang": "0.6"}
    async with aiohttp.ClientSession() as session, session.get(url, params=params) as r:
        SilenceBound(r.content, BOUND_S)
        first = await r.content.readany()
        silent_from = time.monotonic()
        with pytest.raises(StreamSilent) as ended:
            await _read_all(r)
        waited = time.monotonic() - silent_from
    assert first and isinstance(ended.value, TimeoutError)  # caught where a read timeout is
    assert BOUND_S - 0.02 <= waited <= BOUND_S * (1 + 1 / LOOKS_PER_BOUND) + 0.15, waited


async def test_a_cancelled_bound_ends_nothing(url: str) -> None:
    params = {"every": "0.01", "count": "1", "hang": str(BOUND_S * 2)}
    async with aiohttp.ClientSession() as session, session.get(url, params=params) as r:
        SilenceBound(r.content, BOUND_S).cancel()
        assert await _read_all(r) == 16  # read through a silence of twice the bound


async def test_a_body_that_has_ended_stops_the_watch(url: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(url, params={"every": "0", "count": "1"}) as r:
        await _read_all(r)
        bound = SilenceBound(r.content, BOUND_S)
        await asyncio.sleep(BOUND_S / LOOKS_PER_BOUND + 0.05)
        assert bound._handle is None and r.content.exception() is None
