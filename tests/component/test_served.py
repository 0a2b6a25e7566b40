"""The same app served as ``sweetspot serve`` serves it: under uvicorn with the gateway's front door
(``gateway.server.process.front_door``), on a loopback socket, inside the test's event loop. What only a socket
shows: a client's hang-up noticed by the server, and the limits a client meets before any request reaches the app.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

import httpx
import pytest
import uvicorn

from gateway.common.asgi_server import listen_socket
from gateway.server.process.front_door import FrontDoorLimits, guarded_protocol
from tests.component.conftest import (
    BOUND_S,
    CHAT,
    DONE,
    MODEL,
    ROLE,
    Gate,
    GatewayUnderTest,
    Stage,
    body_then,
    chat_answer,
    stream,
    token,
    until,
    whole,
)


@asynccontextmanager
async def served(gw: GatewayUnderTest) -> AsyncIterator[str]:
    """Serve the gateway's app (lifespan already running) as ``sweetspot serve`` does: uvicorn, httptools behind
    the front door's limits from the settings, refusals counted in the app's metrics. Yields its base URL."""
    settings = gw.settings
    rejections = gw.parts.metrics.rejections
    limits = FrontDoorLimits(
        max_connections=settings.max_connections,
        max_header_bytes=settings.max_header_bytes,
        read_timeout_s=settings.request_read_timeout_s,
        on_refusal=lambda reason: rejections.labels(reason).inc(),
    )
    sock = listen_socket("127.0.0.1", 0)
    config = uvicorn.Config(
        gw.app, http=guarded_protocol(limits), lifespan="off", log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await until(lambda: server.started or task.done())
        assert server.started, task
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        async with asyncio.timeout(BOUND_S):
            await task
        sock.close()


async def exchange_raw(url: str, data: bytes) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(BOUND_S):
            return await reader.read()
    finally:
        writer.close()


def head_of(answer: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


async def test_a_stream_over_a_real_connection_and_a_hang_up_the_server_notices(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(stream(ROLE, token("a"), DONE), stream(ROLE, token("a"), gate, token("b"), DONE))
    gw = await stage.gateway(upstream)
    body = {"model": MODEL, "messages": CHAT, "stream": True}
    async with served(gw) as url, httpx.AsyncClient(base_url=url, timeout=BOUND_S) as client:
        whole = await client.post("/v1/chat/completions", json=body)
        assert whole.status_code == 200 and whole.content == ROLE + token("a") + DONE

        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for chunk in response.aiter_raw():
                if b'"a"' in chunk:
                    break
        # leaving the block closes the connection mid-stream: uvicorn tells the app, which ends the request
        seen = upstream.posts()[-1]
        await upstream.wait(lambda: seen.aborted)
        await until(lambda: gw.inflight() == 0)
        assert gw.outcomes(upstream) == {"ok": 1, "client_cancelled": 1}
    gw.assert_settled()


async def test_hang_ups_while_queued_and_while_answered_whole_are_noticed_on_the_connection(stage: Stage) -> None:
    """Under the gateway's own protocol a request learns of its client's hang-up from the connection itself
    (gateway.common.connection_loss), not from a task waiting on receive(): a client that hangs up while its
    request waits for a whole answer has the upstream request aborted, one that hangs up while queued leaves
    the queue, and both give back what they held."""
    upstream = await stage.upstream()
    gate = Gate()
    payload = json.dumps(chat_answer("held")).encode()
    upstream.then(body_then(payload, sent=0, end="hang", gate=gate))
    gw = await stage.gateway(upstream, initial_limit=1)
    body = {"model": MODEL, "messages": CHAT}
    async with (
        served(gw) as url,
        httpx.AsyncClient(base_url=url, timeout=BOUND_S) as first,
        httpx.AsyncClient(base_url=url, timeout=BOUND_S) as second,
    ):
        running = asyncio.create_task(first.post("/v1/chat/completions", json=body))
        (seen,) = await upstream.received_count(1)
        queued = asyncio.create_task(second.post("/v1/chat/completions", json=body))
        await until(lambda: gw.parts.queue.depth == 1)
        queued.cancel()  # the client's connection closes while its request is queued
        await until(lambda: gw.parts.queue.depth == 0)
        running.cancel()  # and while the first one waits for its whole answer
        await upstream.wait(lambda: seen.aborted)
        await until(lambda: gw.inflight() == 0)
        assert gw.outcomes(upstream) == {"client_cancelled": 1}
        assert len(upstream.posts()) == 1
    gate.open()
    gw.assert_settled()


async def test_a_head_over_the_limit_is_a_431_and_the_connection_closes(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, max_header_bytes=1024)
    async with served(gw) as url:
        answer = await exchange_raw(url, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"y" * 2000 + b"\r\n\r\n")
    status, headers, body = head_of(answer)
    assert status == 431 and headers["connection"] == "close"
    assert body["error"]["code"] == "headers_too_large"
    assert gw.metric("sweetspot_rejections_total", reason="headers_too_large") == 1


async def test_a_head_that_arrives_too_slowly_is_a_408(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, request_read_timeout_s=0.1)
    async with served(gw) as url:
        answer = await exchange_raw(url, b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # and the rest never comes
    status, headers, body = head_of(answer)
    assert status == 408 and headers["connection"] == "close"
    assert body["error"]["code"] == "request_timeout"
    assert gw.metric("sweetspot_rejections_total", reason="request_timeout") == 1


async def test_a_connection_past_the_cap_is_a_503_with_retry_after(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, max_connections=1)
    async with served(gw) as url:
        host, port = url.removeprefix("http://").split(":")
        _, holder = await asyncio.open_connection(host, int(port))
        try:
            answer = await exchange_raw(url, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        finally:
            holder.close()
    status, headers, body = head_of(answer)
    assert status == 503 and headers["retry-after"] == "1"
    assert body["error"]["code"] == "too_many_connections"


async def test_kept_connections_serve_one_request_after_another(stage: Stage) -> None:
    """The head limit and timer are per request: a kept connection's second request is not judged by the first's."""
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, max_header_bytes=1024, request_read_timeout_s=0.5)
    async with served(gw) as url, httpx.AsyncClient(base_url=url, timeout=BOUND_S) as client:
        for _ in range(3):
            answer = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
            assert answer.status_code == 200
    assert len(upstream.posts()) == 3


async def test_pipelined_requests_are_answered_whole_and_in_order(stage: Stage) -> None:
    """Two requests sent in one write on a kept connection (HTTP/1.1 pipelining): the front door keeps a
    request's connection-loss handle and head timer per request begun, not per connection, so the second is
    parsed while the first is being answered and each gets its own whole answer, in order."""
    upstream = await stage.upstream()
    upstream.then(whole(chat_answer("one")), whole(chat_answer("two")))
    gw = await stage.gateway(upstream)
    body = json.dumps({"model": MODEL, "messages": CHAT}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    kept = head + b"content-length: %d\r\n\r\n" % len(body) + body
    closing = head + b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    async with served(gw) as url:
        answers = await exchange_raw(url, kept + closing)
    first_head, _, rest = answers.partition(b"\r\n\r\n")
    length = int(first_head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    first = head_of(first_head + b"\r\n\r\n" + rest[:length])
    second = head_of(rest[length:])
    assert [(status, answer["choices"][0]["message"]["content"]) for status, _, answer in (first, second)] == [
        (200, "one"),
        (200, "two"),
    ]
    assert second[1]["connection"] == "close"
    await until(lambda: gw.inflight() == 0)
    gw.assert_settled()


async def test_a_body_whole_with_its_head_is_read_without_a_timer_and_one_still_arriving_with_one(
    stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The front door marks a request whose body has all arrived: reading it cannot wait, so no timer is armed
    (it costs more than the read), on a generation route as on a light one. A body still arriving is read under
    ``request_read_timeout_s``: a trickle that stops is a 408."""
    from gateway.server.routes import inbound

    armed: list[float] = []

    def timeout(delay: float) -> asyncio.Timeout:
        armed.append(delay)
        return asyncio.timeout(delay)

    monkeypatch.setattr(inbound, "asyncio", SimpleNamespace(timeout=timeout))
    upstream = await stage.upstream()
    upstream.then(whole(chat_answer()), whole({"tokens": [1, 2]}), whole(chat_answer()))
    gw = await stage.gateway(upstream, request_read_timeout_s=0.3)

    def post_head(path: bytes, body: bytes) -> bytes:
        head = b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n" % path
        return head + b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)

    body = json.dumps({"model": MODEL, "messages": CHAT}).encode()
    head = post_head(b"/v1/chat/completions", body)
    light = json.dumps({"model": MODEL, "prompt": "x"}).encode()
    light_head = post_head(b"/tokenize", light)
    async with served(gw) as url:
        status, _, _ = head_of(await exchange_raw(url, head + body))
        assert status == 200 and armed == []
        status, _, answer = head_of(await exchange_raw(url, light_head + light))  # a light route reads it the same way
        assert (status, answer, armed) == (200, {"tokens": [1, 2]}, [])

        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(head + body[:10])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(body[10:])
            async with asyncio.timeout(BOUND_S):
                status, _, _ = head_of(await reader.read())
        finally:
            writer.close()
        assert status == 200 and armed == [0.3]

        status, _, answer = head_of(await exchange_raw(url, head + body[:10]))  # and the rest never comes
    assert status == 408 and answer["error"]["code"] == "request_timeout"
    assert len(armed) == 2 and len(upstream.posts()) == 3
