"""The client's side of a proxied request: the headers the gateway reads, the body, and noticing when
the client hangs up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")


class RequestHeaders:
    """The few request headers the gateway reads, found in one pass over the raw ASGI list (which the
    server gives lower-cased). Starlette's ``Headers`` decodes every header again on each lookup."""

    __slots__ = ("authorization", "content_length", "request_id", "priority")

    def __init__(self, raw: list[tuple[bytes, bytes]], priority_header: str) -> None:
        self.authorization: str | None = None
        self.content_length: str | None = None
        self.request_id: str | None = None
        self.priority: str | None = None
        priority_name = priority_header.lower().encode("latin-1")
        for name, value in raw:
            if name == b"authorization":
                self.authorization = value.decode("latin-1")
            elif name == b"content-length":
                self.content_length = value.decode("latin-1")
            elif name == b"x-request-id":
                self.request_id = value.decode("latin-1") or None
            elif name == priority_name:
                self.priority = value.decode("latin-1")


async def read_body(receive: Receive, *, limit: int, declared_length: str | None) -> bytes | None:
    """The whole request body, or None when it is (or says it is) over ``limit`` bytes. A body that came
    in one message (the usual case) is returned as it came, without copying. Raises :class:`ClientGone`
    when the client hangs up before sending all of it."""
    if declared_length is not None and declared_length.isdigit() and int(declared_length) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            return None
        if not message.get("more_body"):
            return b"".join([*chunks, body]) if chunks else body
        chunks.append(body)


class ClientGone(Exception):
    """The client hung up while its request was queued or running."""


class DisconnectWatch:
    """Cancels the request's task when its client hangs up, so every await on the request path
    (queue, upstream, stream) stops at once without racing each one against a watcher of its own.

    :meth:`guard` turns that cancellation into :class:`ClientGone`; a cancellation from anywhere else
    (server shutdown) propagates unchanged.
    """

    def __init__(self, receive: Receive) -> None:
        self._task = asyncio.current_task()
        self._watcher = asyncio.ensure_future(self._watch(receive))
        self._watcher.add_done_callback(self._on_gone)

    @staticmethod
    async def _watch(receive: Receive) -> None:
        # The body was read already, so the next ASGI message is the disconnect.
        while (await receive())["type"] != "http.disconnect":
            pass

    def _on_gone(self, watcher: asyncio.Future) -> None:
        if not watcher.cancelled() and self._task is not None:
            self._task.cancel()

    @property
    def gone(self) -> bool:
        return self._watcher.done() and not self._watcher.cancelled()

    def absorb(self) -> bool:
        """In an ``except CancelledError``: True (and the cancellation undone) if the client left."""
        if self.gone and self._task is not None:
            self._task.uncancel()
            return True
        return False

    async def guard(self, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self.absorb():
                raise ClientGone from None
            raise

    def stop(self) -> None:
        self._watcher.remove_done_callback(self._on_gone)
        self._watcher.cancel()
