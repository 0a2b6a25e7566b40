"""Which streams keep their upstream connection: vLLM's do, llama-server's and unknown servers' do not.

A real HTTP server on loopback records, for each streamed request, its ``Connection`` header and the
client port it came from; the gateway's own upstream client sends the requests with the headers the
gateway builds for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.server.feedback.control_loop import ControlLoop
from gateway.server.parts import Gateway
from gateway.server.upstream.upstream_headers import request_headers
from gateway.settings import Settings
from testbed.loopback import serving

EVENTS = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b"data: [DONE]\n\n"]


class Recorder:
    def __init__(self, metrics: str) -> None:
        self.metrics = metrics
        self.seen: list[tuple[str | None, int]] = []  # (Connection header, client port) per stream

    async def stream(self, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        self.seen.append((request.headers.get("Connection"), request.transport.get_extra_info("peername")[1]))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in EVENTS:
            await response.write(event)
        await response.write_eof()
        return response

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics, content_type="text/plain")


VLLM_METRICS = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.0\n"
LLAMA_METRICS = "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n"


@pytest.fixture(params=["vllm", "llamacpp"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, Recorder, str]]:
    recorder = Recorder(VLLM_METRICS if request.param == "vllm" else LLAMA_METRICS)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", recorder.stream)
    app.router.add_get("/metrics", recorder.metrics_page)
    async with serving(app) as url:
        yield request.param, recorder, url


async def stream_once(gateway: Gateway, url: str) -> bytes:
    upstream = gateway.pool.by_name[url]
    headers = request_headers(None, None, "req-1", stream=True, keep_alive=upstream.streams_keep_alive)
    async with asyncio.timeout(10):  # a stream's head has no bound of the client's own: its caller's
        reply = await gateway.client.send(
            url, "/v1/chat/completions", b'{"stream":true}', headers, name="upstream-1", stream=True
        )
    try:
        return await reply.response.read()
    finally:
        reply.close()


async def test_streams_keep_their_connection_only_once_the_backend_is_known_to_keep_it(server) -> None:
    kind, recorder, url = server
    gateway = Gateway.build(Settings(upstreams=[url], control_enabled=False))
    control_loop = ControlLoop.build(gateway)
    control_loop.start()
    try:
        assert not gateway.pool.by_name[url].streams_keep_alive  # not scraped yet: close, the safe default
        assert await stream_once(gateway, url) == b"".join(EVENTS)
        await control_loop.scrape()
        assert gateway.pool.by_name[url].streams_keep_alive == (kind == "vllm")
        for _ in range(3):
            assert await stream_once(gateway, url) == b"".join(EVENTS)
    finally:
        await gateway.client.close()

    assert recorder.seen[0][0] == "close"
    later = recorder.seen[1:]
    if kind == "vllm":
        assert [header for header, _ in later] == [None, None, None]
        assert len({port for _, port in later}) == 1, later  # one pooled connection served them all
    else:
        assert [header for header, _ in later] == ["close", "close", "close"]
        assert len({port for _, port in later}) == 3, later  # a new connection each time
