"""When a request may be sent again: only when the upstream provably never processed it.

A pooled keep-alive connection can be closed by the server while it sits idle (llama-server closes one
after every streamed reply and any idle one after 5 s, while announcing keep-alive). A request written on
such a *reused* connection fails with one of :data:`STALE_CONNECTION_ERRORS` and no answer: the server had
closed it before reading anything, so sending it again on another connection delivers it once. The same
error on a *fresh* connection means the server took the request and then dropped the connection, and a
resend could run the generation twice; it is never resent. A refused connection
(``ClientConnectorError``, itself a ``ClientOSError``) reached nobody and is not a stale connection.

``reuse_tracing`` gives a session the trace hook that tells the two apart (:class:`ConnectionUse`);
``resend_if_stale`` is the loop for idempotent GETs (the health poll, the benchmark clients), which may be
resent whatever connection they went out on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import TypeVar

import aiohttp

STALE_CONNECTION_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)

T = TypeVar("T")


class ConnectionUse:
    """Filled in by :func:`reuse_tracing`'s hook for one request: whether it went out on a pooled connection.
    Pass it as the request's ``trace_request_ctx``."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


async def _on_reuse(session: aiohttp.ClientSession, context: SimpleNamespace,
                    params: aiohttp.TraceConnectionReuseconnParams) -> None:
    use = context.trace_request_ctx
    if isinstance(use, ConnectionUse):
        use.reused = True


def reuse_tracing() -> aiohttp.TraceConfig:
    """A trace config that marks a request's :class:`ConnectionUse` when the pool hands it a kept connection."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_on_reuse)
    return trace


def is_stale(exc: BaseException, use: ConnectionUse) -> bool:
    """True when ``exc`` is a kept connection found closed: the request never reached the server."""
    return use.reused and isinstance(exc, STALE_CONNECTION_ERRORS) and not isinstance(
        exc, aiohttp.ClientConnectorError)


async def resend_if_stale(attempt: Callable[[], Awaitable[T]], *, resends: int,
                          on_resend: Callable[[], None] | None = None) -> T:
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
