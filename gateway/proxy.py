"""Talking to upstreams: send a request, pass its answer back (streamed chunk by chunk), capture
usage and timing, and close the upstream request the moment the client goes away.

The upstream client is aiohttp, chosen by measurement (see ``bench/upstream_client.py`` and the
README): on this class of machine it spends several times less CPU per request than httpx, which
decides how much of a small CPU the gateway leaves to everything else.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.api.errors import sse_error_event
from gateway.control.window import Outcome
from gateway.measure import RequestTracker
from gateway.resend import STALE_CONNECTION_ERRORS, resend_if_stale
from gateway.telemetry.metrics import GatewayMetrics

log = logging.getLogger("sweetspot.proxy")

STALE_RETRIES = 2  # resends of a request whose pooled connection was dead (see gateway.resend)


class UpstreamUnavailable(Exception):
    """The upstream could not be reached or failed before sending a byte: another may be tried."""

    def __init__(self, message: str, *, status: int | None = None, body: bytes | None = None,
                 connect_failed: bool = False, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.connect_failed = connect_failed
        self.retry_after = retry_after  # the upstream's own Retry-After, if it sent one


@dataclass
class UpstreamReply:
    """An upstream response whose status and headers have arrived; the body is still unread."""

    response: aiohttp.ClientResponse

    @property
    def status(self) -> int:
        return self.response.status

    def close(self) -> None:
        self.response.close()


class UpstreamClient:
    """One pooled aiohttp session for all upstream traffic."""

    def __init__(self, *, connect_timeout_s: float, total_timeout_s: float, metrics: GatewayMetrics) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._total_timeout_s = total_timeout_s
        self._metrics = metrics
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Idle connections are dropped before the servers' own 5 s (uvicorn's under vLLM, cpp-httplib's
            # under llama-server) would close them under a request being written.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector,
                # One session serves every client: an upstream's cookies must not reach the next client.
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=self._total_timeout_s, connect=self._connect_timeout_s),
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, base_url: str, path: str, body: bytes, headers: dict[str, str]) -> UpstreamReply:
        """POST and wait for the status line. Raises :class:`UpstreamUnavailable` for failures that
        happened before any byte of an answer (connect errors, 5xx), retrying stale connections."""
        url = base_url + path
        retries = self._metrics.upstream_retries
        try:
            response = await resend_if_stale(
                lambda: self.session.post(url, data=body, headers=headers), resends=STALE_RETRIES,
                on_resend=lambda: retries.labels(base_url, "stale_connection").inc())
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnavailable(f"cannot connect to {base_url}: {exc}", connect_failed=True) from exc
        except STALE_CONNECTION_ERRORS as exc:
            raise UpstreamUnavailable(f"{base_url} closed the connection: {exc}") from exc
        except asyncio.TimeoutError:
            raise
        except aiohttp.ClientError as exc:  # anything else before an answer: try elsewhere
            raise UpstreamUnavailable(f"{base_url}: {type(exc).__name__}: {exc}") from exc
        if response.status >= 500:
            payload = await _read_quietly(response)
            raise UpstreamUnavailable(
                f"{base_url} answered {response.status}", status=response.status, body=payload,
                retry_after=response.headers.get("Retry-After"),
            )
        return UpstreamReply(response)


async def _read_quietly(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.read()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return b""
    finally:
        response.release()


def _has_token(choices: list) -> bool:
    """True when a chunk carries generated output (not just the role or an empty delta)."""
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            or delta.get("tool_calls")
        ):
            return True
    return False


class SSEFilter:
    """Watches an upstream SSE stream event by event: times the first token, counts tokens, keeps the
    usage, and drops the usage-only chunk when the client did not ask for it.

    Parsing every event as JSON cost more CPU than the rest of the streamed path together, so once the
    first token is seen, only events that may carry usage or an error are parsed; the other JSON events
    count as one token each. That count is an estimate (the closing chunk often carries no token) that
    the upstream's usage corrects at the end (:meth:`RequestTracker.finish`); without usage, the last
    event is parsed when the stream ends to take it back. The first token, which decides TTFT, is always
    found by parsing. Tokens are credited once per read: events that arrive together share a timestamp.
    A read whose events are all kept is passed on as the same bytes object, without copying; once tokens
    flow, a read of whole events with nothing that may be usage or an error is not even split: its JSON
    events are counted by how they end.
    """

    def __init__(self, tracker: RequestTracker, clock: Callable[[], float], *, forward_usage: bool) -> None:
        self._tracker = tracker
        self._clock = clock
        self._forward_usage = forward_usage
        self._rest = b""  # an event not complete yet
        self._separator = b"\n\n"
        self._framed = False  # the separator is settled once the first event is complete
        self._seen_token = False
        self._seen_usage = False
        self._json_end = b"}\n\n"  # how a JSON event ends
        self._last_counted: bytes | None = None  # the last read (or event) counted without parsing
        self._tokens = 0  # counted in the current read
        self.upstream_error: str | None = None

    def feed(self, data: bytes) -> bytes:
        """Bytes to send to the client for this read: every complete event, filtered."""
        if (self._seen_token and not self._rest and data.endswith(self._separator)
                and b'"usage"' not in data and b'"error"' not in data):
            # Once tokens flow, most reads are whole token events and nothing to drop: each JSON event
            # (one ending in "}") counts, and the read is passed on as it is.
            count = data.count(self._json_end)
            if count:
                self._last_counted = data
                self._tracker.tokens(count, self._clock())
            return data
        if self._rest:
            data, self._rest = self._rest + data, b""
        if not self._framed and b"\r\n" in data:
            self._separator = b"\r\n\r\n"  # the spec allows CRLF line ends; the servers seen use LF
        separator = self._separator
        step = len(separator)
        kept: bytearray | None = None  # only built once an event is dropped
        start = 0
        while (end := data.find(separator, start)) >= 0:
            stop = end + step
            event = data[start:stop]
            if self._keep(event, step):
                if kept is not None:
                    kept += event
            elif kept is None:
                kept = bytearray(data[:start])
            start = stop
        if start and not self._framed:
            self._framed = True
            self._json_end = b"}" + separator
        if start < len(data):
            self._rest = data[start:]
        if self._tokens:
            self._tracker.tokens(self._tokens, self._clock())
            self._tokens = 0
        if kept is not None:
            return bytes(kept)
        return data if start == len(data) else data[:start]

    def flush(self) -> bytes:
        """Whatever is left when the stream ends (an unterminated last event); settles the token count."""
        if not self._seen_usage and self._last_counted is not None:
            # No usage came: take back the estimate for a last event that carried no token.
            chunk = _parse(self._last_json_event(self._last_counted))
            if chunk is not None and not _has_token(chunk.get("choices") or []):
                self._tracker.tokens(-1, self._clock())
        rest, self._rest = self._rest, b""
        return rest if rest.strip() else b""

    def _last_json_event(self, counted: bytes) -> bytes:
        """The last JSON event of a counted read (or the event itself)."""
        end = counted.rfind(self._json_end)
        if end < 0:
            return counted
        start = counted.rfind(self._separator, 0, end)
        return counted[start + len(self._separator) if start >= 0 else 0:end + len(self._json_end)]

    def _keep(self, event: bytes, step: int) -> bool:
        if not event.startswith(b"data:"):
            return True  # comments / keep-alives / other SSE fields pass through
        if (self._seen_token and event[-step - 1] == 0x7D  # "}": a JSON event, not [DONE]
                and b'"usage"' not in event and b'"error"' not in event):
            self._tokens += 1
            self._last_counted = event
            return True
        chunk = _parse(event)
        if chunk is None:
            return True
        if "error" in chunk:  # OpenAI's and llama-server's shape
            error = chunk["error"]
            self.upstream_error = error.get("message") if isinstance(error, dict) else str(error)
            return True
        if chunk.get("object") == "error":  # vLLM's ErrorResponse, flat
            self.upstream_error = str(chunk.get("message"))
            return True
        choices = chunk.get("choices")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._seen_usage = True
            self._tracker.usage(usage)
        if choices:
            self._last_counted = None
            if _has_token(choices):
                self._seen_token = True
                self._tokens += 1
            return True
        return self._forward_usage or not isinstance(usage, dict)


def _parse(event: bytes) -> dict | None:
    """The JSON object of a ``data:`` event, or None for anything else (``[DONE]``, text, arrays)."""
    try:
        chunk = json.loads(event[5:])
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None


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
