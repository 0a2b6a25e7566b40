"""The streamed reply to the client: an upstream SSE reply passed on as it arrives, with one clean-up at its
end whatever happens (the upstream request closed, the permit released, the sample recorded)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.control.window import Outcome
from gateway.server.errors import sse_error_event
from gateway.server.sse import SSEFilter
from gateway.server.upstream_client import UpstreamReply

log = logging.getLogger("sweetspot.proxy")


class ProxyStreamResponse(Response):
    """Streams an upstream SSE reply to the client as it arrives and always cleans up once: closes the
    upstream request (which aborts generation there), releases the permit, records the sample.

    A client hang-up arrives as a cancellation of this task; ``absorb_cancel`` tells it apart from a
    server shutdown (and undoes it, so the clean-up runs and the request ends quietly).
    """

    def __init__(
        self,
        reply: UpstreamReply,
        sse: SSEFilter,
        *,
        request_id: str,
        absorb_cancel: Callable[[], bool],
        on_done: Callable[[Outcome], None],
    ) -> None:
        # Not Response.__init__: it would render an empty body and give the stream a content-length.
        self.status_code = reply.status
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # nginx and friends in front: do not buffer the stream
            (b"x-request-id", request_id.encode("latin-1")),
        ]
        self._reply = reply
        self._sse = sse
        self._absorb_cancel = absorb_cancel
        self._on_done = on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = Outcome.CLIENT_CANCELLED
        try:
            outcome = await self._pump(send)
        except asyncio.CancelledError:
            if not self._absorb_cancel():
                raise
        finally:
            self._reply.close()
            self._on_done(outcome)

    async def _pump(self, send: Send) -> Outcome:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        sse = self._sse
        outcome = Outcome.OK
        try:
            async for data in self._reply.response.content.iter_any():
                out = sse.feed(data)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            tail = sse.flush()
            if tail:
                await send({"type": "http.response.body", "body": tail, "more_body": True})
            if sse.upstream_error is not None:
                outcome = Outcome.UPSTREAM_ERROR
        except asyncio.TimeoutError:
            outcome = Outcome.TIMED_OUT
            await send({"type": "http.response.body", "more_body": True,
                        "body": sse_error_event("the upstream timed out mid-stream", code="upstream_timeout",
                                                status=504)})
        except (aiohttp.ClientError, OSError) as exc:
            outcome = Outcome.UPSTREAM_ERROR
            log.warning("upstream stream broke: %s: %s", type(exc).__name__, exc)
            await send({"type": "http.response.body", "more_body": True,
                        "body": sse_error_event(f"the upstream failed mid-stream ({type(exc).__name__})",
                                                code="upstream_disconnected")})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return outcome
