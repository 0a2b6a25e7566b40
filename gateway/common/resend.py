"""When a request may be sent again: only when the upstream provably never processed it.

A pooled keep-alive connection can be closed by the server while it sits idle (llama-server closes one
after every streamed reply and any idle one after 5 s, while announcing keep-alive). A request written on
such a *reused* connection fails with one of :data:`STALE_CONNECTION_ERRORS` and no answer, at once: the
server had closed it before reading anything, so sending it again on another connection delivers it once.
The same error later than :data:`STALE_WITHIN_S` after the request went out is not that race: a server
that read the request, held it for seconds and died (an OOM kill, a rollout) fails it the same way, and a
resend could run the generation twice. The same error on a *fresh* connection means the server took the
request and then dropped the connection. Neither is ever resent. A refused connection
(``ClientConnectorError``, itself a ``ClientOSError``) reached nobody and is not a stale connection.

:class:`ReuseAwareConnector` tells the two apart for a request sent inside ``with ConnectionUse()`` (a
context variable carries it, so nothing is added to a request's path but one check in the connector:
aiohttp's tracing, which could tell it too, costs several awaits per request). ``resend_if_stale`` is the
loop for idempotent GETs (the health poll, the benchmark clients), which may be resent whatever connection
they went out on.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp

STALE_CONNECTION_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
#: How soon after a request went out on a kept connection its failure still proves the server had closed the
#: connection before reading it. A closed connection fails the request within a round trip (the server's FIN
#: or RST is already there or comes back at once); a quarter second covers a busy event loop and a slow
#: network, and is far shorter than any generation an engine could have started and lost.
STALE_WITHIN_S = 0.25

T = TypeVar("T")


_CURRENT: contextvars.ContextVar[ConnectionUse | None] = contextvars.ContextVar(
    "sweetspot_connection_use", default=None
)


class ConnectionUse:
    """Whether one request went out on a kept (pooled) connection: requests sent inside ``with use:`` (in this
    task) report their connection's reuse into it, filled in by :class:`ReuseAwareConnector`."""

    __slots__ = ("_token", "reused")

    def __init__(self) -> None:
        self.reused = False
        self._token: contextvars.Token[ConnectionUse | None] | None = None

    def __enter__(self) -> ConnectionUse:
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _CURRENT.reset(self._token)
        self._token = None


class ReuseAwareConnector(aiohttp.TCPConnector):
    """A TCP connector that knows the connections it handed out before: one it hands out again is a reuse."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed_out: weakref.WeakSet[object] = weakref.WeakSet()

    async def connect(self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout) -> Any:
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        if protocol is not None:
            reused = protocol in self._handed_out
            if not reused:  # (a WeakSet's add makes a weak reference even for a member)
                self._handed_out.add(protocol)
            use = _CURRENT.get()
            if use is not None:
                use.reused = reused
        return connection


def is_stale(exc: BaseException, use: ConnectionUse, elapsed_s: float = 0.0) -> bool:
    """True when ``exc`` is a kept connection found closed at the write, ``elapsed_s`` after the request went
    out: the request never reached the server."""
    return (
        use.reused
        and elapsed_s <= STALE_WITHIN_S
        and isinstance(exc, STALE_CONNECTION_ERRORS)
        and not isinstance(exc, aiohttp.ClientConnectorError)
    )


async def resend_if_stale(
    attempt: Callable[[], Awaitable[T]], *, resends: int, on_resend: Callable[[], None] | None = None
) -> T:
    """For idempotent requests only: ``await attempt()``, called again up to ``resends`` times while it fails
    on a stale connection; the last failure propagates. ``on_resend`` runs before each resend (a metric)."""
    for tried in range(resends + 1):
        try:
            return await attempt()
        except aiohttp.ClientConnectorError:
            raise
        except STALE_CONNECTION_ERRORS:
            if tried == resends:
                raise
            if on_resend is not None:
                on_resend()
    raise AssertionError("unreachable")
