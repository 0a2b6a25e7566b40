"""The floor of sweetspot's stack: a bare ASGI pass-through on the same parts (uvicorn with httptools and
uvloop, one aiohttp session upstream), with nothing of the gateway's own (no validation, queue, limiter,
measurement, metrics or FastAPI).

``bench/overhead.py`` measures it beside the gateway in the same run, so the gateway's own cost is the
difference between the two, and what the stack itself costs on the machine is on the record. Not a
product: it forwards POST bodies and streams answers back, nothing else.

    python -m bench.floor_proxy UPSTREAM_URL      # prints "floor listening on http://127.0.0.1:PORT"
"""

from __future__ import annotations

import sys

import aiohttp
from starlette.types import Receive, Scope, Send

from gateway.common.asgi_server import serve_app  # (the gateway's own uvicorn settings)


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


def main() -> None:
    serve_app(FloorProxy(sys.argv[1]), name="floor", host="127.0.0.1", port=0, log_level="warning")


if __name__ == "__main__":
    main()
