"""The sweep's client resends a request whose pooled connection the server had already given up on.

llama-server closes its connection after every streamed reply while announcing keep-alive; a client that
reuses the connection right after fails before the server read a byte of the request (a direct sweep of
llama-server lost about one request in twenty that way). The server here makes that deterministic: each
connection serves one request, and closes on the next one without answering.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

import pytest

from gateway.sweep.client import StreamClient, Target
from gateway.sweep.workload import RequestFactory, Workload, parse_length

USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
BODY = (
    b"".join(
        b"data: " + json.dumps(event).encode() + b"\n\n"
        for event in (
            {"choices": [{"index": 0, "text": "a"}]},
            {"choices": [{"index": 0, "text": "b"}]},
            {"choices": [], "usage": USAGE},
        )
    )
    + b"data: [DONE]\n\n"
)
REPLY = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
    b"Keep-Alive: timeout=5, max=100\r\nContent-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
)


class OneRequestPerConnection(asyncio.Protocol):
    """Answers the first request of a connection; closes it, unanswered, on the second."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.buffer = b""
        self.served = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        match = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
        if match is None or len(rest) < int(match.group(1)):
            return
        self.buffer = rest[int(match.group(1)) :]
        if self.served:
            self.log.append("closed unanswered")
            self.transport.close()
            return
        self.served = True
        self.log.append("served")
        self.transport.write(REPLY)  # type: ignore[attr-defined]


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    log: list[str] = []
    srv = await asyncio.get_running_loop().create_server(lambda: OneRequestPerConnection(log), "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        srv.close()
        await srv.wait_closed()


async def test_a_stale_pooled_connection_is_resent_on_a_new_one(server) -> None:
    url, log = server
    workload = Workload(api="completions", prompt_len=parse_length(3), output_len=parse_length(2))
    factory = RequestFactory(workload)
    async with StreamClient(Target(url, api="completions", model="m")) as client:
        records = [await client.send(factory.next()) for _ in range(3)]
    assert [r.error for r in records] == [None, None, None]
    assert all(r.ok and r.output_tokens == 2 and len(r.chunk_times) == 2 for r in records)
    # Request 2 found the pooled connection stale and went out again on a connection opened for it, which
    # is not pooled; request 3 found the pool empty and opened one.
    assert log == ["served", "closed unanswered", "served", "served"]
