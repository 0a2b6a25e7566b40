"""Streams of named events (the Responses API's and Anthropic Messages'), watched without being altered.

A chat or completions stream is ``data:`` chunks (:mod:`gateway.server.relay.sse`). The Responses API and
Anthropic's Messages API name each event (``event: response.output_text.delta``), so the name alone says
what an event is: a token (one delta each, as vLLM and llama-server send them), the usage, an error, the
response's id. Only the few events that carry usage, an error or an id are parsed; the rest are counted
by name. Every byte reaches the client as the upstream sent it: these APIs always report usage, so there
is nothing to ask for and nothing to drop. The count of deltas is corrected by the usage at the end
(:meth:`RequestTracker.finish`), as for chat.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.server.relay.measure import RequestTracker
from gateway.server.relay.sse import MAX_EVENT_BYTES, PartialEvent


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def responses_usage(payload: dict[str, Any]) -> dict[str, int] | None:
    """``{"prompt_tokens", "completion_tokens"}`` of a Responses API object (a reply, or an event's
    ``response``)."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    return {"prompt_tokens": _int(usage.get("input_tokens")), "completion_tokens": _int(usage.get("output_tokens"))}


def messages_usage(payload: dict[str, Any]) -> dict[str, int] | None:
    """The same for an Anthropic message: its input counts the cached prompt too, as Anthropic defines it."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = sum(
        _int(usage.get(key)) for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    return {"prompt_tokens": prompt, "completion_tokens": _int(usage.get("output_tokens"))}


def openai_usage(payload: dict[str, Any]) -> dict[str, int] | None:
    """Chat, completions, embeddings, rerank and score: OpenAI's usage (rerank reports only a total)."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens", usage.get("total_tokens"))
    return {"prompt_tokens": _int(prompt), "completion_tokens": _int(usage.get("completion_tokens"))}


@dataclass(frozen=True)
class EventTable:
    """Which event names are tokens, carry usage, errors, the response's id, or end the stream, for one API."""

    tokens: frozenset[bytes]
    usage: frozenset[bytes]
    errors: frozenset[bytes]
    ends: frozenset[bytes]
    ids: frozenset[bytes] = frozenset()


RESPONSES_EVENTS = EventTable(
    tokens=frozenset(
        {
            b"response.output_text.delta",
            b"response.reasoning_text.delta",
            b"response.refusal.delta",
            b"response.function_call_arguments.delta",
        }
    ),
    usage=frozenset({b"response.completed", b"response.incomplete", b"response.failed"}),
    errors=frozenset({b"error", b"response.failed"}),
    ends=frozenset({b"response.completed", b"response.incomplete", b"response.failed"}),
    ids=frozenset({b"response.created"}),
)
MESSAGES_EVENTS = EventTable(
    tokens=frozenset({b"content_block_delta"}),
    usage=frozenset({b"message_start", b"message_delta"}),
    errors=frozenset({b"error"}),
    ends=frozenset({b"message_stop"}),
)


class NamedEventFilter:
    """Watches one named-event stream for a :class:`RequestTracker`; :meth:`feed` returns what to send on
    (always the bytes it was given). An event not complete yet is kept for its parse up to
    ``max_event_bytes``; past it :meth:`feed` raises :class:`~gateway.server.relay.sse.EventTooLarge`."""

    def __init__(
        self,
        tracker: RequestTracker,
        clock: Callable[[], float],
        table: EventTable,
        *,
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> None:
        self._tracker = tracker
        self._clock = clock
        self._table = table
        self._rest = PartialEvent(max_event_bytes)  # an event not complete yet
        self._separator = b"\n\n"
        self.seen_token = False
        self.upstream_error: str | None = None
        self.finished = False  # the API's closing event came
        self.response_id: str | None = None
        self._prompt: int | None = None

    def feed(self, data: bytes) -> bytes:
        text = data
        if self._rest:
            joined, self._separator = self._rest.extend(data, self._separator, crlf_may_start=True)
            if joined is None:
                return data  # the event goes on
            text = joined
        if text.find(b"\r\n") >= 0:  # find, not `in`: bytes' `in` makes and drops a TypeError first
            self._separator = b"\r\n\r\n"
        separator, step = self._separator, len(self._separator)
        tokens = 0
        start = 0
        while (end := text.find(separator, start)) >= 0:
            tokens += self._event(text[start:end])
            start = end + step
        if start < len(text):
            self._rest.start(memoryview(text)[start:])
        if tokens:
            self.seen_token = True
            self._tracker.tokens(tokens, self._clock())
        return data

    def flush(self) -> bytes:
        rest = self._rest.take()
        if rest.strip():
            self._event(rest)
        return b""

    def _event(self, event: bytes) -> int:
        """Tokens this event carries (0 or 1); notes usage, errors and the id on the way."""
        if not event.startswith(b"event:"):
            return 0
        line_end = event.find(b"\n")
        name = event[6 : line_end if line_end >= 0 else len(event)].strip()
        table = self._table
        if name in table.tokens:
            return 1
        if name in table.ends:
            self.finished = True
        if name in table.usage or name in table.errors or name in table.ids:
            payload = _data_of(event)
            if payload is not None:
                self._note(name, payload)
        return 0

    def _note(self, name: bytes, payload: dict[str, Any]) -> None:
        table = self._table
        response = payload.get("response")
        if name in table.ids and isinstance(response, dict) and isinstance(response.get("id"), str):
            self.response_id = response["id"]
        if name in table.errors:
            error = payload.get("error")
            if isinstance(response, dict) and isinstance(response.get("error"), dict):
                error = response["error"]
            message = error.get("message") if isinstance(error, dict) else payload.get("message")
            self.upstream_error = str(message or name.decode())
        if name in table.usage:
            self._usage(name, payload, response)

    def _usage(self, name: bytes, payload: dict[str, Any], response: Any) -> None:
        if isinstance(response, dict):  # the Responses API: the whole response, usage included
            usage = responses_usage(response)
        elif name == b"message_start" and isinstance(payload.get("message"), dict):
            usage = messages_usage(payload["message"])
            if usage is not None:
                self._prompt = usage["prompt_tokens"]
            return  # its output count is a placeholder; message_delta brings the real one
        else:  # message_delta: the output so far (cumulative), and the input again on newer servers
            usage = messages_usage(payload)
            if usage is not None and not usage["prompt_tokens"] and self._prompt is not None:
                usage["prompt_tokens"] = self._prompt
        if usage is not None:
            self._tracker.usage(usage)


def _data_of(event: bytes) -> dict[str, Any] | None:
    """The JSON object of an event's ``data:`` line."""
    at = event.find(b"data:")
    if at < 0:
        return None
    end = event.find(b"\n", at)
    try:
        payload = json.loads(event[at + 5 : end if end >= 0 else len(event)])
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None
