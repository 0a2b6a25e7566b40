"""The HTTP front door: limits a client meets before any request reaches the app.

uvicorn's httptools protocol has no bound on a request's head and no timeout for receiving one: a client
could send megabytes of headers (each connection buffering them) or open connections and trickle bytes
(slowloris) for ever. :class:`GuardedHttpToolsProtocol` adds, per connection:

* a connection cap: past ``max_connections`` open connections a new one is answered 503 with
  Retry-After and closed;
* a head limit: a request line and headers over ``max_header_bytes`` get 431 and the connection is closed,
  having buffered at most the limit plus one read;
* a head timeout: a connection must complete each request's head within ``read_timeout_s`` of its first
  byte (a new connection, of its opening), else 408 and closed. Idle kept-alive connections are closed by
  uvicorn's own keep-alive timeout; the body's own timeout is the request path's (it reads the body).

It also tells each request the moment its connection is lost, through a
:class:`~gateway.common.connection_loss.ConnectionLoss` in the request's scope, so the request path needs no
task per request waiting on ``receive()`` for the hang-up.

Each refusal is an OpenAI-shaped JSON error and is counted in ``sweetspot_rejections_total``.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.common.connection_loss import EXTENSION, ConnectionLoss
from gateway.server.routes.errors import error_body

_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


@dataclass(frozen=True)
class FrontDoorLimits:
    max_connections: int
    max_header_bytes: int
    read_timeout_s: float
    on_refusal: Callable[[str], None] = lambda reason: None  # counts a refusal by its reason


def refusal(status: int, message: str, code: str, *, retry_after_s: int | None = None) -> bytes:
    """A complete HTTP/1.1 response carrying an OpenAI-shaped error, closing the connection."""
    body = json.dumps(error_body(message, status=status, code=code)).encode()
    head = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        f"x-sweetspot-reason: {code}",
    ]
    if retry_after_s is not None:
        head.append(f"retry-after: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above; ``limits`` is set by :func:`guarded_protocol`."""

    limits: FrontDoorLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # bytes received while in a head (a head not complete yet is buffered whole)
        self._oversized = False  # the current request's head was complete but too large: not run
        self._in_head = True  # reading a request's head (or waiting for the first byte of one)
        self._head_timer: asyncio.TimerHandle | None = None
        self._losses: deque[ConnectionLoss] = deque()  # of the requests begun and not answered yet, oldest first

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                503,
                f"the gateway holds {self.limits.max_connections} connections already",
                "too_many_connections",
                retry_after_s=1,
            )
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)
        while self._losses:
            self._losses.popleft().fire()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        too_large = self._oversized or (self._in_head and self._head_bytes > self.limits.max_header_bytes)
        if too_large and not self.transport.is_closing():
            self._refuse(431, f"request headers exceed {self.limits.max_header_bytes} bytes", "headers_too_large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._arm_head_timer()
        loss = ConnectionLoss()
        self._losses.append(loss)
        self.scope["extensions"] = {EXTENSION: loss}  # type: ignore[dict-item]

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._disarm_head_timer()
        # The head as parsed (a head that arrived in one read never trips the running count above).
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.limits.max_header_bytes:
            self._oversized = True  # refused once the parser returns; the request never reaches the app
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._oversized:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._oversized:
            if self._losses:
                self._losses[-1].body_received = True  # the request being parsed is the last one begun
            super().on_message_complete()

    def on_response_complete(self) -> None:
        self._in_head = True  # the next bytes are the next request's head
        if self._losses:
            self._losses.popleft()  # answered: a later loss of the connection is not this request's
        super().on_response_complete()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.read_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(
                408, f"request headers not received within {self.limits.read_timeout_s:g} s", "request_timeout"
            )

    def _refuse(self, status: int, message: str, code: str, *, retry_after_s: int | None = None) -> None:
        self._disarm_head_timer()
        self.limits.on_refusal(code)
        self.transport.write(refusal(status, message, code, retry_after_s=retry_after_s))
        self.transport.close()


def guarded_protocol(limits: FrontDoorLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection (``uvicorn.Config(http=...)``), bound to ``limits``."""
    return type("GatewayHttpProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})
