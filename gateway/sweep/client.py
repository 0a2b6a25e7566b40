"""One streamed OpenAI request, timed the way ``vllm bench serve`` times it.

aiohttp rather than httpx: the load generator must stay far from being the bottleneck at the chunk rates
a sweep drives, on the same small machine as the server, and aiohttp's C-accelerated reader spends far less
CPU per request (``python -m bench.upstream_client`` compares them; the README has the figures).

Timing (all ``time.perf_counter()``): the clock starts just before the POST; every SSE data message
whose first choice carries generated text (``delta.content``, ``delta.reasoning_content`` /
``reasoning``, ``delta.tool_calls``, or ``text`` for completions) is a *chunk* and gets an arrival
timestamp; TTFT is the first chunk; ITL the gaps between chunks; E2E latency ends at the last data
message before ``[DONE]`` (the usage message included, as in vLLM's chat client). One deliberate
difference from ``vllm bench serve``: it starts TTFT's clock at any message with ``choices``, so a
server that sends the ``{"role": "assistant", "content": ""}`` chunk *before* prefill would report a
TTFT of nearly zero; here that chunk, carrying no token, is not a chunk.

Output tokens come from the ``usage`` the server reports when asked with
``stream_options.include_usage``; only when it is missing do we fall back to counting chunks and
say so on the record (``usage_reported=False``).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.common.headers import QUEUE_HEADER
from gateway.common.resend import STALE_CONNECTION_ERRORS
from gateway.sweep.workload import ApiKind, RequestSpec

REJECT_STATUSES = frozenset({429, 503})  # overload answers (a gateway's queue), not backend failures
_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
#: Named-event APIs: the ``type`` of each event's data that carries one token, and where usage is.
_TOKEN_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
        "content_block_delta",
    }
)
_ERROR_EVENTS = frozenset({"error", "response.failed"})


def normalize_base_url(url: str) -> str:
    """``http://h:p``, ``http://h:p/`` and ``http://h:p/v1`` all mean the same server."""
    base = url.strip().rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how to send: the server, the API flavour, the model and any credentials."""

    base_url: str
    api: ApiKind = "chat"
    model: str | None = None
    api_key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0

    @property
    def endpoint(self) -> str:
        return normalize_base_url(self.base_url) + _PATHS[self.api]

    def request_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
            if self.api == "messages":
                headers["x-api-key"] = self.api_key
        if self.api == "messages":
            headers["anthropic-version"] = "2023-06-01"
        headers.update(self.headers)
        return headers


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times are absolute ``perf_counter`` seconds."""

    index: int
    prompt_len: int
    max_tokens: int
    start: float
    status: int | None = None
    ok: bool = False
    error: str | None = None
    error_kind: str | None = None  # "http", "connect", "timeout", "stream"
    retry_after: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrivals of token-carrying chunks
    end: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    usage_reported: bool = False
    queue_seconds: float | None = None  # a sweetspot gateway's X-Sweetspot-Queue-Seconds: its queue's part of TTFT

    @property
    def rejected(self) -> bool:
        """A 429/503 overload answer: shown separately, not a failure of the backend."""
        return self.status in REJECT_STATUSES

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def upstream_ttft(self) -> float | None:
        """TTFT net of a gateway's queue (the whole TTFT when no gateway said): what the backend took."""
        ttft = self.ttft
        return None if ttft is None else ttft - (self.queue_seconds or 0.0)

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1) for requests with more than one output token."""
        if not self.ok or self.output_tokens < 2 or self.end is None or not self.chunk_times:
            return None
        return (self.end - self.chunk_times[0]) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        times = self.chunk_times
        return [b - a for a, b in itertools.pairwise(times)]


class SSEDecoder:
    """Splits a byte stream into Server-Sent-Event data payloads (``data:`` lines joined per event)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        events: list[bytes] = []
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                break
            line = self._buffer[:newline].rstrip(b"\r")
            self._buffer = self._buffer[newline + 1 :]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                self._data.append(line[5:].lstrip(b" "))
            # other fields (event:, id:, retry:) and comments (":" pings) carry nothing we time
        return events

    def close(self) -> list[bytes]:
        """Flush an event the server did not terminate with a blank line."""
        events = self.feed(b"\n") if self._buffer else []
        if self._data:
            events.append(b"\n".join(self._data))
            self._data = []
        return events


def _seconds(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _error_message(body: bytes) -> str:
    try:
        data = json.loads(body)
        message = data.get("error", {}).get("message") if isinstance(data.get("error"), dict) else None
        return str(message or data.get("error") or data.get("detail") or body[:200].decode(errors="replace"))
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


_DELTA_TOKEN_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")


def _carries_token(choice: Any, chat: bool) -> bool:
    """Whether a streamed choice holds generated output (not just the role or a finish reason)."""
    if not isinstance(choice, dict):
        return False
    if not chat:
        return bool(choice.get("text"))
    delta = choice.get("delta") or {}
    return any(delta.get(name) for name in _DELTA_TOKEN_FIELDS)


class StreamClient:
    """Sends streamed requests over one pooled aiohttp session. Use as an async context manager."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # never pools: for resends (see _post)

    async def __aenter__(self) -> StreamClient:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=self.target.timeout_s)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("StreamClient is not open; use 'async with StreamClient(target)'")
        return self._session

    async def list_models(self) -> list[str]:
        """The ids from ``GET /v1/models``, in the server's order."""
        url = normalize_base_url(self.target.base_url) + "/v1/models"
        headers = self.target.request_headers()
        async with self.session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"GET {url} answered {resp.status}: {_error_message(body)}")
        data = json.loads(body)
        return [str(item["id"]) for item in data.get("data", []) if isinstance(item, dict) and "id" in item]

    async def send(self, spec: RequestSpec, on_chunk: Callable[[], None] | None = None) -> RequestRecord:
        """Send one request and return its record; never raises for server or network failures."""
        body: dict[str, Any] = dict(spec.body)
        if self.target.model is not None:
            body["model"] = self.target.model
        record = RequestRecord(index=spec.index, prompt_len=spec.prompt_len, max_tokens=spec.max_tokens, start=0.0)
        payload = json.dumps(body).encode()
        headers = self.target.request_headers()
        record.start = time.perf_counter()
        try:
            async with await self._post(payload, headers, record) as resp:
                record.status = resp.status
                record.queue_seconds = _seconds(resp.headers.get(QUEUE_HEADER))
                if resp.status != 200:
                    record.retry_after = _retry_after(resp.headers)
                    record.error = f"HTTP {resp.status}: {_error_message(await resp.read())}"
                    record.error_kind = "http"
                    record.end = time.perf_counter()
                    return record
                await self._read_stream(resp, record, on_chunk)
        except TimeoutError:
            record.error, record.error_kind = f"timed out after {self.target.timeout_s:g} s", "timeout"
        except (aiohttp.ClientError, OSError) as exc:
            record.error, record.error_kind = f"{type(exc).__name__}: {exc}", "connect"
        if record.error is None and not record.chunk_times:
            record.error, record.error_kind = "stream ended without a single chunk", "stream"
        record.ok = record.error is None
        if not record.usage_reported:
            record.output_tokens = len(record.chunk_times)
        if record.end is None:
            record.end = time.perf_counter()
        return record

    async def _post(self, payload: bytes, headers: dict[str, str], record: RequestRecord) -> aiohttp.ClientResponse:
        """POST and wait for the status line, sending once more, on a new connection, when the pooled one
        turns out stale.

        llama-server closes the connection after every streamed reply while announcing keep-alive; a
        request written on it right after fails before the server has read it, so it is safe to resend.
        The resend goes out on a connection opened for it: with many streams the pool holds several dead
        connections, and a resend drawn from it can find another one (a sweep at 16 clients lost one
        request per level that way). The clock restarts: the failed attempt cost the server nothing.
        """
        try:
            return await self.session.post(self.target.endpoint, data=payload, headers=headers)
        except aiohttp.ClientConnectorError:
            raise
        except STALE_CONNECTION_ERRORS:
            record.start = time.perf_counter()
        if self._fresh is None:
            self._fresh = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True), timeout=self.session.timeout
            )
        return await self._fresh.post(self.target.endpoint, data=payload, headers=headers)

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, record: RequestRecord, on_chunk: Callable[[], None] | None
    ) -> None:
        decoder = SSEDecoder()
        chat = self.target.api == "chat"
        done = False
        async for raw in resp.content.iter_any():
            now = time.perf_counter()
            for data in decoder.feed(raw):
                if data == b"[DONE]":
                    done = True
                    break
                self._on_message(data, now, record, chat, on_chunk)
            if done or record.error is not None:
                break
        if not done and record.error is None:
            for data in decoder.close():
                if data != b"[DONE]":
                    self._on_message(data, time.perf_counter(), record, chat, on_chunk)

    @staticmethod
    def _on_message(
        data: bytes, now: float, record: RequestRecord, chat: bool, on_chunk: Callable[[], None] | None
    ) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            record.error, record.error_kind = f"unreadable SSE data: {data[:120]!r}", "stream"
            return
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if isinstance(kind, str) and kind not in ("chat.completion.chunk", "text_completion"):
            StreamClient._on_event(kind, message, now, record, on_chunk)
            return
        if message.get("error"):
            error = message["error"]
            text = error.get("message") if isinstance(error, dict) else error
            record.error, record.error_kind = f"error in stream: {text}", "stream"
            return
        record.end = now
        choices = message.get("choices")
        if choices and _carries_token(choices[0], chat):
            record.chunk_times.append(now)
            if on_chunk is not None:
                on_chunk()
        usage = message.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            record.output_tokens = int(usage["completion_tokens"])
            record.prompt_tokens = usage.get("prompt_tokens")
            record.usage_reported = True

    @staticmethod
    def _on_event(
        kind: str, message: dict[str, Any], now: float, record: RequestRecord, on_chunk: Callable[[], None] | None
    ) -> None:
        """One event of the Responses or Messages API (its data's ``type`` names it)."""
        if kind in _ERROR_EVENTS:
            error = message.get("error") or (message.get("response") or {}).get("error") or message
            text = error.get("message") if isinstance(error, dict) else error
            record.error, record.error_kind = f"error in stream: {text}", "stream"
            return
        record.end = now
        if kind in _TOKEN_EVENTS:
            record.chunk_times.append(now)
            if on_chunk is not None:
                on_chunk()
        elif kind in ("response.completed", "response.incomplete"):
            usage = (message.get("response") or {}).get("usage") or {}
            if usage.get("output_tokens") is not None:
                record.output_tokens = int(usage["output_tokens"])
                record.prompt_tokens = usage.get("input_tokens")
                record.usage_reported = True
        elif kind == "message_start":
            usage = (message.get("message") or {}).get("usage") or {}
            record.prompt_tokens = sum(
                int(usage.get(key) or 0)
                for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
            )
        elif kind == "message_delta":
            usage = message.get("usage") or {}
            if usage.get("output_tokens") is not None:
                record.output_tokens = int(usage["output_tokens"])
                record.usage_reported = True
