"""A request's connection telling the app, by a callback, that its client hung up.

ASGI tells an app of a hang-up only through ``receive()``: an app that wants to stop a request when its
client goes away keeps a task waiting on ``receive()`` for the request's whole life, a task created and
cancelled per request. The gateway's own HTTP protocol (:mod:`gateway.server.process.front_door`) knows the
moment a connection is lost, and offers it in the request's scope instead, under
``scope["extensions"][EXTENSION]``: a :class:`ConnectionLoss` the request subscribes a callback to. Under any
other server the extension is absent and the app falls back to the waiting task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: The key of the request scope's ``extensions`` under which the connection offers its :class:`ConnectionLoss`.
EXTENSION = "sweetspot.connection_loss"


class ConnectionLoss:
    """One request's view of its connection: whether it was lost, and one callback to run when it is; and
    whether the request's body has all arrived (``body_received``), so that reading it cannot wait and needs no
    timer of its own."""

    __slots__ = ("_callback", "body_received", "lost")

    def __init__(self) -> None:
        self.lost = False
        self.body_received = False
        self._callback: Callable[[], None] | None = None

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the connection is lost (at once, if it was already)."""
        if self.lost:
            callback()
        else:
            self._callback = callback

    def unsubscribe(self) -> None:
        self._callback = None

    def fire(self) -> None:
        """The connection was lost: called by the protocol, once."""
        self.lost = True
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


def connection_loss(scope: Mapping[str, Any]) -> ConnectionLoss | None:
    """The request's :class:`ConnectionLoss`, when its server offers one."""
    extensions = scope.get("extensions") or {}
    found = extensions.get(EXTENSION)
    return found if isinstance(found, ConnectionLoss) else None
