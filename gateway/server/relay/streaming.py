"""The streamed reply to the client: an upstream SSE reply passed on as it arrives, with one clean-up at its
end whatever happens (the upstream request closed, the permit released, the sample recorded)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.common.headers import QUEUE_HEADER, queue_header_value
from gateway.control.window import Outcome
from gateway.server.relay.request_watch import RequestWatch, Stop
from gateway.server.relay.sse import EventTooLarge, StreamWatcher
from gateway.server.upstream.upstream_client import UpstreamReply

log = logging.getLogger("sweetspot.proxy")


class ProxyStreamResponse(Response):
    """Streams an upstream SSE reply to the client as it arrives and always cleans up once: closes the
    upstream request (which aborts generation there), releases the permit, records the sample.

    The request's :class:`RequestWatch` may cancel this task: for a client hang-up (the request ends
    quietly), for the drain deadline (an error event saying the gateway is shutting down), or because no
    first token came in time (``overdue``, the timer armed before the request went upstream, which bounded
    its head too and is cancelled here at the first token; an error event saying the upstream timed out).
    From the first token on, a silence longer than ``stream_idle_timeout_s`` ends the stream with an error
    event too (:meth:`UpstreamReply.bound_silence`). Those are a stream's only bounds in time: one that keeps
    producing may run past ``upstream_timeout_s``, which bounds whole answers. An event that grows past its
    bound without ending (:class:`EventTooLarge`) ends the stream with an error event, an upstream error.
    """

    def __init__(
        self,
        reply: UpstreamReply,
        sse: StreamWatcher,
        *,
        request_id: str,
        queue_seconds: float,
        watch: RequestWatch,
        overdue: asyncio.TimerHandle,
        on_done: Callable[[Outcome], None],
        error_event: Callable[[str, str, int], bytes],
    ) -> None:
        # Not Response.__init__: it would render an empty body and give the stream a content-length.
        self.status_code = reply.status
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # nginx and friends in front: do not buffer the stream
            (b"x-request-id", request_id.encode("latin-1")),
            (QUEUE_HEADER.encode(), queue_header_value(queue_seconds).encode()),
        ]
        self._reply = reply
        self._sse = sse
        self._watch = watch
        self._overdue = overdue
        self._on_done = on_done
        self._error_event = error_event  # (message, code, status) -> an error event in the client's API
        self._started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = Outcome.CLIENT_CANCELLED
        try:
            outcome = await self._pump(send)
        except asyncio.CancelledError:
            why = self._watch.absorb()
            if why is None:
                raise
            if why is Stop.CLIENT_GONE and self._sse.finished:
                # The client had the whole answer (it may close as soon as the closing event arrives,
                # before the upstream ends its body): nothing was lost.
                self._sse.flush()  # settles the token count; nobody is left to send the rest to
                outcome = Outcome.OK if self._sse.upstream_error is None else Outcome.UPSTREAM_ERROR
            elif why is Stop.SHUTDOWN:
                outcome = Outcome.SHUT_DOWN
                await self._end_with(
                    send,
                    self._error_event("the gateway is shutting down; retry on another replica", "shutting_down", 503),
                )
            elif why is Stop.FIRST_TOKEN_TIMEOUT:
                outcome = Outcome.TIMED_OUT
                await self._end_with(
                    send, self._error_event("the upstream produced no token in time", "upstream_timeout", 504)
                )
        finally:
            self._reply.close()
            self._on_done(outcome)

    async def _end_with(self, send: Send, event: bytes) -> None:
        """End the stream with an error event (the client may be gone already: nothing to do then)."""
        try:
            if not self._started:
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass

    async def _pump(self, send: Send) -> Outcome:
        overdue: asyncio.TimerHandle | None = self._overdue
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self._started = True
        sse = self._sse
        outcome = Outcome.OK
        try:
            async for data in self._reply.response.content.iter_any():
                out = sse.feed(data)
                if overdue is not None and sse.seen_token:
                    overdue.cancel()
                    overdue = None
                    self._reply.bound_silence()  # the first token came: from now on, silence has a bound
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            tail = sse.flush()
            if tail:
                await send({"type": "http.response.body", "body": tail, "more_body": True})
            if sse.upstream_error is not None:
                outcome = Outcome.UPSTREAM_ERROR
        except TimeoutError:
            outcome = Outcome.TIMED_OUT
            await send(
                {
                    "type": "http.response.body",
                    "more_body": True,
                    "body": self._error_event("the upstream went silent mid-stream", "upstream_timeout", 504),
                }
            )
        except EventTooLarge as exc:
            outcome = Outcome.UPSTREAM_ERROR
            log.warning("upstream stream broke: %s", exc)
            # The blank line ends the unfinished event a named-event stream passed on; to a reader of whole
            # events (a chat stream's, whose unfinished event was kept back) it is nothing.
            body = b"\n\n" + self._error_event(str(exc), "upstream_event_too_large", 502)
            await send({"type": "http.response.body", "more_body": True, "body": body})
        except (aiohttp.ClientError, OSError) as exc:
            outcome = Outcome.UPSTREAM_ERROR
            log.warning("upstream stream broke: %s: %s", type(exc).__name__, exc)
            await send(
                {
                    "type": "http.response.body",
                    "more_body": True,
                    "body": self._error_event(
                        f"the upstream failed mid-stream ({type(exc).__name__})", "upstream_disconnected", 502
                    ),
                }
            )
        finally:
            if overdue is not None:
                overdue.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return outcome
