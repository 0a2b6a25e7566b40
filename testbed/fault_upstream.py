"""A misbehaving OpenAI-style upstream on loopback that counts what reaches it.

The gateway's production rules are about what an upstream *received*: a request must reach upstreams at most
once, a hung upstream must not hold a permit for ever. :class:`FaultUpstream` is a raw TCP server (a thread
per connection, HTTP/1.1 parsed by hand, so it can do what no real server framework lets it: read a request
and drop the connection, close a kept connection under the next request, answer headers and then stall). It
answers ``GET /health`` and ``GET /v1/models`` normally so the gateway's health poll sees it up, and counts
every POST it read in full (``deliveries``) with its headers (``seen_headers``).

Modes (``mode``, changeable while it runs):

* ``ok``: a small chat completion (streamed or not, as asked), keep-alive.
* ``drop``: read the request, then close the connection without a byte.
* ``close_next``: answer like ``ok`` and keep the connection, but close it without reading when the next
  request arrives on it (a kept connection the server had closed: the keep-alive race, made certain).
* ``crash_kept``: answer like ``ok``, but a POST on a kept connection is read, held ``CRASH_AFTER_S`` and then
  the whole server dies (every connection dropped, nothing listens any more): an engine killed mid-generation.
* ``status:<code>``: answer ``<code>`` with an OpenAI-shaped error body (the engine's own refusal).
* ``proxy_status:<code>``: answer ``<code>`` with an HTML page, as a proxy in front of an engine does.
* ``hang``: read the request, never answer.
* ``delay:<seconds>``: answer like ``ok``, that many seconds after reading the request (a slow tokenizer).
* ``stall``: answer a stream's headers and one token, then go silent.
* ``no_token``: answer a stream's headers and a chunk with no token (the role only), then go silent.
* ``linger``: answer a stream whole, ``[DONE]`` included, then hold its body open ``LINGER_S`` before ending
  it (a client that closes at ``[DONE]`` hangs up before the gateway sees the upstream's end).
* ``slow_stream``: a stream of ``SLOW_TOKENS`` tokens (`` 0``, `` 1``, ...), one every ``SLOW_TOKEN_S``, then
  its usage and ``[DONE]``: a long generation that never goes silent.
* ``late_token:<s>``: a stream's headers at once, its first token after ``<s>`` seconds, then like ``ok``.
* ``no_separator``: a stream's headers, then one event that never ends (``data: ...`` and no blank line),
  ``NO_SEPARATOR_PIECE`` bytes at a time until the gateway hangs up or ``NO_SEPARATOR_MAX`` bytes went out
  (``endless_sent`` counts them).
* ``big:<bytes>``: a whole (not streamed) chat completion of about ``<bytes>`` bytes: one choice whose
  ``logprobs.content`` lists that many bytes' worth of tokens, its ``usage`` last (a reader must scan it all),
  sent with chunked encoding (no ``content-length`` to refuse it by) ``BIG_PIECE`` bytes at a time.
* ``held:<mode>``: counted in ``held``, then held until :meth:`FaultUpstream.release` (or :meth:`close`), then
  answered as ``<mode>``: requests that keep the gateway's permits taken while a test fills its queue.

A request may choose its own mode: a ``"fault"`` field in its body (the gateway forwards fields it does not
know untouched) is that request's mode instead of ``mode``, e.g. ``{"fault": "held:big:157286400", ...}``.
Only ``stream`` and ``fault`` are read from a body (msgspec skips the rest), so a 16 MiB request costs the
upstream no parsed tree.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import msgspec

MODEL = "fault-model"
LINGER_S = 5.0
CRASH_AFTER_S = 2.0
SLOW_TOKENS = 8
SLOW_TOKEN_S = 0.5
NO_SEPARATOR_PIECE = 64 * 1024
NO_SEPARATOR_MAX = 512 * 1024 * 1024
BIG_PIECE = 1024 * 1024
#: One token of a ``big:`` answer's ``logprobs.content``.
BIG_TOKEN = b'{"token":" tok","logprob":-0.25,"bytes":[32,116,111,107],"top_logprobs":[]}'


class _RequestHead(msgspec.Struct):
    """The fields the fake upstream reads from a request body; the rest is skipped unbuilt."""

    stream: Any = None
    fault: Any = None


_HEAD = msgspec.json.Decoder(_RequestHead)


class FaultUpstream:
    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.models_status = 200  # what GET /v1/models answers (401: a vLLM started with --api-key)
        self.deliveries = 0
        self.seen_headers: list[dict[str, str]] = []
        self.endless_sent = 0  # bytes of the never-ending event sent (mode no_separator)
        self.held = 0  # requests that reached a held: mode (held now or since released)
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(512)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop listening (later connections are refused) and drop every open connection."""
        self._stop.set()
        _close(self._sock)  # shutdown wakes the thread blocked in accept(); close alone would not
        with self._lock:
            for conn in list(self._open):
                _close(conn)

    def release(self) -> None:
        """Answer every request held by a ``held:`` mode, and the later ones at once."""
        self._released.set()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        served = 0
        try:
            while True:
                head = _read_head(reader)
                if head is None:
                    return
                method, path, headers = head
                if served and self.mode == "close_next" and method == "POST":
                    return  # a kept connection closed under the next request, which was never read
                body = reader.read(int(headers.get("content-length", "0")))
                if method == "GET":
                    conn.sendall(_get_answer(path, self.models_status))
                    served += 1
                    continue
                with self._lock:
                    self.deliveries += 1
                    self.seen_headers.append(headers)
                if served and self.mode == "crash_kept":
                    self._stop.wait(CRASH_AFTER_S)
                    self.close()
                    return
                if not self._answer(conn, _request_head(body)):
                    return
                served += 1
        except OSError:
            return
        finally:
            with self._lock:
                self._open.discard(conn)
            _close(conn)

    def _answer(self, conn: socket.socket, request: dict) -> bool:
        """Answer one POST; False to close the connection afterwards (or without answering)."""
        mode = request.get("fault") or self.mode
        if mode.startswith("held:"):
            with self._lock:
                self.held += 1
            while not self._released.wait(0.1):
                if self._stop.is_set():
                    return False
            mode = mode.split(":", 1)[1]
        if mode == "drop":
            return False
        if mode == "hang":
            self._stop.wait()
            return False
        if mode.startswith("delay:"):
            self._stop.wait(float(mode.split(":", 1)[1]))
        if mode.startswith("proxy_status:"):
            status = int(mode.split(":", 1)[1])
            page = f"<html><body><h1>{status} Service Temporarily Unavailable</h1></body></html>".encode()
            conn.sendall(_response(status, page, "text/html"))
            return True
        if mode.startswith("status:"):
            status = int(mode.split(":", 1)[1])
            body = json.dumps(
                {
                    "error": {
                        "message": f"fault upstream answers {status}",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                }
            ).encode()
            conn.sendall(_response(status, body, "application/json"))
            return True
        if mode.startswith("big:"):
            self._big_answer(conn, big_answer(int(mode.split(":", 1)[1])))
            return True
        if request.get("stream"):
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            if mode == "no_token":
                conn.sendall(_chunk(_event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})))
                self._stop.wait()
                return False
            if mode == "no_separator":
                self._endless_event(conn)
                return False
            if mode.startswith("late_token:") and self._stop.wait(float(mode.split(":", 1)[1])):
                return False
            tokens = SLOW_TOKENS if mode == "slow_stream" else 1
            for index in range(tokens):
                if index and self._stop.wait(SLOW_TOKEN_S):
                    return False
                content = f" {index}" if mode == "slow_stream" else "hello"
                conn.sendall(_chunk(_event({"choices": [{"index": 0, "delta": {"content": content}}]})))
            if mode == "stall":
                self._stop.wait()
                return False
            usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}
            conn.sendall(_chunk(_event({"choices": [], "usage": usage})) + _chunk(b"data: [DONE]\n\n"))
            if mode == "linger":
                self._stop.wait(LINGER_S)
            conn.sendall(b"0\r\n\r\n")
            return True
        body = json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        ).encode()
        conn.sendall(_response(200, body, "application/json"))
        return True

    def _big_answer(self, conn: socket.socket, body: bytes) -> None:
        """``body`` with chunked encoding, ``BIG_PIECE`` bytes a chunk (slices of it, never copies)."""
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        view = memoryview(body)
        for start in range(0, len(body), BIG_PIECE):
            piece = view[start : start + BIG_PIECE]
            conn.sendall(f"{len(piece):x}\r\n".encode())
            conn.sendall(piece)
            conn.sendall(b"\r\n")
        conn.sendall(b"0\r\n\r\n")

    def _endless_event(self, conn: socket.socket) -> None:
        """One event that never ends, sent until the gateway hangs up (an OSError ends the connection)."""
        conn.sendall(_chunk(b'data: {"choices": [{"index": 0, "delta": {"content": "'))
        piece = _chunk(b"x" * NO_SEPARATOR_PIECE)
        while self.endless_sent < NO_SEPARATOR_MAX and not self._stop.is_set():
            conn.sendall(piece)
            with self._lock:
                self.endless_sent += NO_SEPARATOR_PIECE
        self._stop.wait()


def _request_head(body: bytes) -> dict[str, Any]:
    """``stream`` and ``fault`` of a request body (a body that is not a JSON object reads as neither)."""
    try:
        head = _HEAD.decode(body or b"{}")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}
    return {"stream": head.stream, "fault": head.fault if isinstance(head.fault, str) else None}


@lru_cache(maxsize=2)
def big_answer(nbytes: int) -> bytes:
    """A chat.completion of about ``nbytes`` bytes (at least one token), ``usage`` last; built once per size."""
    tokens = max(1, (nbytes - 400) // (len(BIG_TOKEN) + 1))
    head = json.dumps({"id": "chatcmpl-big", "object": "chat.completion", "created": 0, "model": MODEL}).encode()[:-1]
    usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}
    return b"".join(
        (
            head,
            b', "choices": [{"index": 0, "message": {"role": "assistant", "content": "big"}, ',
            b'"logprobs": {"content": [',
            b",".join([BIG_TOKEN] * tokens),
            b']}, "finish_reason": "length"}], "usage": ',
            json.dumps(usage).encode(),
            b"}",
        )
    )


def _read_head(reader) -> tuple[str, str, dict[str, str]] | None:  # type: ignore[no-untyped-def]
    line = reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return method, path, headers


def _get_answer(path: str, models_status: int = 200) -> bytes:
    if path.startswith("/v1/models") and models_status != 200:
        error = {"error": {"message": "unauthorized", "type": "invalid_request_error", "param": None, "code": None}}
        return _response(models_status, json.dumps(error).encode(), "application/json")
    if path.startswith("/v1/models"):
        return _response(
            200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode(), "application/json"
        )
    return _response(200, b"{}", "application/json")


def _response(status: int, body: bytes, content_type: str) -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
        "connection: keep-alive\r\n\r\n"
    ).encode() + body


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _close(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):  # the peer has gone already
        conn.shutdown(socket.SHUT_RDWR)
    conn.close()


@contextmanager
def fault_upstream(mode: str = "ok") -> Iterator[FaultUpstream]:
    upstream = FaultUpstream(mode)
    try:
        yield upstream
    finally:
        upstream.close()


def wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
