"""Ending a running request early, from outside its task: its client hung up, the gateway's drain deadline
passed, or its first token is overdue. One :class:`RequestWatch` per admitted request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from enum import Enum
from typing import TypeVar

from starlette.types import Receive

from gateway.common.connection_loss import ConnectionLoss

T = TypeVar("T")


class ClientGone(Exception):
    """The client hung up while its request was queued or running."""


class ServerShutdown(Exception):
    """The gateway's drain deadline passed while the request was running."""


class FirstTokenTimeout(Exception):
    """The upstream produced no first token within ``first_token_timeout_s``."""


class Stop(Enum):
    """Why a request's task was cancelled by its :class:`RequestWatch`."""

    CLIENT_GONE = "client_gone"
    SHUTDOWN = "shutdown"
    FIRST_TOKEN_TIMEOUT = "first_token_timeout"


_RAISED = {Stop.CLIENT_GONE: ClientGone, Stop.SHUTDOWN: ServerShutdown, Stop.FIRST_TOKEN_TIMEOUT: FirstTokenTimeout}


class RequestWatch:
    """Stops a request's task when it must end early: its client hung up, the gateway's drain deadline
    passed (:meth:`interrupt`), or its first token is overdue (:meth:`stop`). One cancellation of the task
    stops every await on the request path at once (queue, upstream, stream) without racing each against a
    watcher of its own.

    :meth:`guard` turns that cancellation into :class:`ClientGone`, :class:`ServerShutdown` or
    :class:`FirstTokenTimeout`; a cancellation from anywhere else propagates unchanged. While it watches, the
    request is in ``registry`` (the drain's set of running requests).
    """

    def __init__(self, receive: Receive, registry: set[RequestWatch], loss: ConnectionLoss | None = None) -> None:
        self._task = asyncio.current_task()
        self.reason: Stop | None = None
        self._registry = registry
        registry.add(self)
        # ``loss``: the gateway's own protocol says when the connection is lost (gateway.common.connection_loss);
        # without it, under another server, a task waits on receive() for the disconnect.
        self._loss = loss
        self._watcher: asyncio.Future[None] | None = None
        if self._loss is not None:
            self._loss.subscribe(self._client_gone)
        else:
            self._watcher = asyncio.ensure_future(self._watch(receive))
            self._watcher.add_done_callback(self._on_gone)

    @staticmethod
    async def _watch(receive: Receive) -> None:
        # The body was read already, so the next ASGI message is the disconnect.
        while (await receive())["type"] != "http.disconnect":
            pass

    def _on_gone(self, watcher: asyncio.Future[None]) -> None:
        if not watcher.cancelled():
            self.stop(Stop.CLIENT_GONE)

    def _client_gone(self) -> None:
        self.stop(Stop.CLIENT_GONE)

    def stop(self, reason: Stop) -> None:
        """Cancel the request's task for ``reason`` (the first reason given wins)."""
        if self.reason is None and self._task is not None:
            self.reason = reason
            self._task.cancel()

    def interrupt(self) -> None:
        """The drain deadline passed: end the request now (a stream ends with an error event)."""
        self.stop(Stop.SHUTDOWN)

    @property
    def gone(self) -> bool:
        return self.reason is Stop.CLIENT_GONE

    def absorb(self) -> Stop | None:
        """In an ``except CancelledError``: why this watch cancelled the task (the cancellation undone), or
        None when the cancellation came from elsewhere."""
        if self.reason is not None and self._task is not None and self._task.cancelling():
            self._task.uncancel()
            return self.reason
        return None

    async def guard(self, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except asyncio.CancelledError:
            reason = self.absorb()
            if reason is not None:
                raise _RAISED[reason] from None
            raise

    def close(self) -> None:
        """The request ended: stop watching it."""
        self._registry.discard(self)
        if self._loss is not None:
            self._loss.unsubscribe()
        if self._watcher is not None:
            self._watcher.remove_done_callback(self._on_gone)
            self._watcher.cancel()
