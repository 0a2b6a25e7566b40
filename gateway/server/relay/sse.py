"""Server-sent events from an upstream: found event by event, the first token timed, tokens counted, usage
kept, and the usage-only chunk dropped when the client did not ask for it (see :class:`SSEFilter`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from gateway.server.relay.measure import RequestTracker

#: The bound on one event when the route passes none: ``max_response_bytes``' default (the route passes the
#: setting). An event is part of an answer, and an answer over that bound is refused whole too.
MAX_EVENT_BYTES = 64 * 1024 * 1024
_CRLF_SEPARATOR = b"\r\n\r\n"


class EventTooLarge(Exception):
    """An upstream event grew past the bound without ending: a broken upstream, or one that does not speak SSE.
    The stream ends with an error event and counts as an upstream error."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the upstream sent an event of more than {limit} bytes without ending it")
        self.limit = limit


class PartialEvent:
    """The start of an event whose end has not come yet, bounded by ``limit`` bytes (:class:`EventTooLarge`).

    Reads are appended, not joined anew, and only the new bytes are searched for the event's end, so an event
    that arrives in many reads costs its length once rather than its length times its reads: an upstream that
    never sends a separator costs the bound in memory and linear time, then ends."""

    __slots__ = ("buffer", "limit")

    def __init__(self, limit: int) -> None:
        self.buffer = bytearray()  # one object for the event's life: a reader may hold it (emptied, not replaced)
        self.limit = limit

    def __len__(self) -> int:
        return len(self.buffer)

    def start(self, rest: bytes | memoryview) -> None:
        """Keep ``rest``, what follows the last complete event of a read (the buffer is empty)."""
        self.buffer += rest
        self._check()

    def extend(self, data: bytes, separator: bytes, *, crlf_may_start: bool) -> tuple[bytes | None, bytes]:
        """The kept bytes and ``data`` joined once an event's ``separator`` has come (None while the event goes
        on), and the separator: ``crlf_may_start``, a CRLF seen in the new bytes makes it CRLF's."""
        buffer = self.buffer
        seen = len(buffer)
        buffer += data
        if crlf_may_start and separator != _CRLF_SEPARATOR and buffer.find(b"\r\n", max(seen - 1, 0)) >= 0:
            separator = _CRLF_SEPARATOR
        if buffer.find(separator, max(seen - len(separator) + 1, 0)) < 0:
            self._check()
            return None, separator
        joined = bytes(buffer)
        buffer.clear()
        return joined, separator

    def take(self) -> bytes:
        """Whatever is kept, emptying the buffer."""
        rest = bytes(self.buffer)
        self.buffer.clear()
        return rest

    def _check(self) -> None:
        if len(self.buffer) > self.limit:
            self.buffer.clear()  # the memory goes now, not when the reply ends
            raise EventTooLarge(self.limit)


class StreamWatcher(Protocol):
    """What the streamed reply needs of whatever watches its events (:class:`SSEFilter`, or
    :class:`~gateway.server.relay.event_streams.NamedEventFilter`)."""

    seen_token: bool
    upstream_error: str | None
    finished: bool  # the stream's closing event came: a hang-up after it loses nothing

    def feed(self, data: bytes) -> bytes:
        """Bytes to send on for this read; raises :class:`EventTooLarge` for an event past the bound."""
        ...

    def flush(self) -> bytes: ...


def _has_token(choices: list) -> bool:
    """True when a chunk carries generated output (not just the role or an empty delta)."""
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls")
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
    events are counted by how they end. An event not complete yet is kept (not passed on) up to
    ``max_event_bytes``; past it :meth:`feed` raises :class:`EventTooLarge`.
    """

    def __init__(
        self,
        tracker: RequestTracker,
        clock: Callable[[], float],
        *,
        forward_usage: bool,
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> None:
        self._tracker = tracker
        self._clock = clock
        self._forward_usage = forward_usage
        self._rest = PartialEvent(max_event_bytes)  # an event not complete yet
        self._pending = self._rest.buffer  # its bytes: tested per read without a call
        self._separator = b"\n\n"
        self._framed = False  # the separator is settled once the first event is complete
        self.seen_token = False
        self._seen_usage = False
        self._json_end = b"}\n\n"  # how a JSON event ends
        self._last_counted: bytes | None = None  # the last read (or event) counted without parsing
        self._tokens = 0  # counted in the current read
        self.upstream_error: str | None = None
        self.finished = False  # ``data: [DONE]`` came
        self._done_end = b"[DONE]\n\n"  # how the closing event ends

    def feed(self, data: bytes) -> bytes:
        """Bytes to send to the client for this read: every complete event, filtered."""
        if (
            self.seen_token
            and not self._pending
            and data.endswith(self._separator)
            and data.find(b'"usage"') < 0  # find, not `in`: bytes' `in` makes and drops a TypeError first
            and data.find(b'"error"') < 0
        ):
            # Once tokens flow, most reads are whole token events and nothing to drop: each JSON event
            # (one ending in "}") counts, and the read is passed on as it is.
            count = data.count(self._json_end)
            if count:
                self._last_counted = data
                self._tracker.tokens(count, self._clock())
            if data.endswith(self._done_end):
                self.finished = True
            return data
        if self._pending:
            joined, self._separator = self._rest.extend(data, self._separator, crlf_may_start=not self._framed)
            if joined is None:
                return b""  # the event goes on
            data = joined
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
            self._done_end = b"[DONE]" + separator
        if start < len(data):
            self._rest.start(memoryview(data)[start:])
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
            if chunk is not None and not _has_token(chunk.choices or []):
                self._tracker.tokens(-1, self._clock())
        rest = self._rest.take()
        return rest if rest.strip() else b""

    def _last_json_event(self, counted: bytes) -> bytes:
        """The last JSON event of a counted read (or the event itself)."""
        end = counted.rfind(self._json_end)
        if end < 0:
            return counted
        start = counted.rfind(self._separator, 0, end)
        return counted[start + len(self._separator) if start >= 0 else 0 : end + len(self._json_end)]

    def _keep(self, event: bytes, step: int) -> bool:
        if not event.startswith(b"data:"):
            return True  # comments / keep-alives / other SSE fields pass through
        if (
            self.seen_token
            and event[-step - 1] == 0x7D  # "}": a JSON event, not [DONE]
            and event.find(b'"usage"') < 0
            and event.find(b'"error"') < 0
        ):
            self._tokens += 1
            self._last_counted = event
            return True
        chunk = _parse(event)
        if chunk is None:
            if event[5:].strip() == b"[DONE]":
                self.finished = True
            return True
        error = chunk.error
        if error is not msgspec.UNSET:  # OpenAI's and llama-server's shape
            self.upstream_error = error.get("message") if isinstance(error, dict) else str(error)
            return True
        if chunk.object == "error":  # vLLM's ErrorResponse, flat
            self.upstream_error = str(chunk.message)
            return True
        choices = chunk.choices
        usage = chunk.usage
        if isinstance(usage, dict):
            self._seen_usage = True
            self._tracker.usage(usage)
        if choices:
            self._last_counted = None
            if _has_token(choices):
                self.seen_token = True
                self._tokens += 1
            return True
        return self._forward_usage or not isinstance(usage, dict)


class _Chunk(msgspec.Struct):
    """The fields of a ``data:`` event the filter reads; the rest (ids, the model, llama-server's timings) is
    skipped as the decoder scans, never built."""

    choices: Any = None
    usage: Any = None
    error: Any = msgspec.UNSET  # present, even as null, means an error event
    object: Any = None
    message: Any = None


_DECODER = msgspec.json.Decoder(_Chunk)


def _parse(event: bytes) -> _Chunk | None:
    """The JSON object of a ``data:`` event, or None for anything else (``[DONE]``, text, arrays)."""
    try:
        return _DECODER.decode(event[5:])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
