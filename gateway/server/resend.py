"""Resending a request whose pooled connection was already dead.

llama-server closes a connection after every streamed reply (and any idle one after 5 s) while still
announcing keep-alive. A request written on such a pooled connection fails before the server has read
it, with one of :data:`STALE_CONNECTION_ERRORS`, so it is safe to send again; a refused connection
(``ClientConnectorError``, itself a ``ClientOSError``) is not stale and is raised at once. The gateway's
upstream client, its health poll and the benchmark clients all resend through :func:`resend_if_stale`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

STALE_CONNECTION_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)

T = TypeVar("T")


async def resend_if_stale(attempt: Callable[[], Awaitable[T]], *, resends: int,
                          on_resend: Callable[[], None] | None = None) -> T:
    """``await attempt()``, called again up to ``resends`` times while it fails on a stale connection;
    the last failure propagates. ``on_resend`` runs before each resend (a metric, say)."""
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
