"""The least any Python proxy can spend: a TCP byte pump on uvloop's protocols, with no HTTP at all.

Each client connection gets its own upstream connection and the bytes are copied both ways from the
transports' callbacks: no parser, no task or future per chunk, no ASGI, nothing of aiohttp. A proxy on
any Python stack that understands HTTP (reads requests, picks an upstream, counts tokens, closes the
upstream when the client goes) does all of this and more, so ``bench/overhead.py`` measures it beside
nginx, the bare stack (``floor_proxy.py``) and the gateway to show what is Python's and what is the stack's.

Not a proxy to use: it cannot see where one request ends, so it relies on the client closing streamed
connections (the benchmark sends ``Connection: close`` on them, as its direct client does).

    python -m bench.pump_floor UPSTREAM_URL      # prints "pump listening on http://127.0.0.1:PORT"
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast
from urllib.parse import urlsplit

from gateway.common.asgi_server import NumericConnectLoop, print_line  # (the gateway's own loop)


class _Side(asyncio.Protocol):
    """One end of a pumped pair: what arrives is written to the peer; back-pressure pauses the peer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.early: list[bytes] = []  # client bytes that arrive before the upstream is connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:  # our outgoing buffer is full: stop reading the side that fills it
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _ClientSide(_Side):
    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self._host, self._port = host, port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(_Side, self._host, self._port)
        except OSError:
            assert self.transport is not None
            self.transport.close()
            return
        upstream.peer, self.peer = self, upstream
        assert upstream.transport is not None
        if self.transport is None or self.transport.is_closing():
            upstream.transport.close()
            return
        for data in self.early:
            upstream.transport.write(data)
        self.early.clear()


async def serve(upstream: str) -> None:
    target = urlsplit(upstream)
    host, port = target.hostname or "127.0.0.1", target.port or 80
    server = await asyncio.get_running_loop().create_server(lambda: _ClientSide(host, port), "127.0.0.1", 0)
    print_line(f"pump listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    await server.serve_forever()


def main() -> None:
    with asyncio.Runner(loop_factory=NumericConnectLoop) as runner:
        runner.run(serve(sys.argv[1]))


if __name__ == "__main__":
    main()
