"""The health poll: each upstream's ``/health`` (falling back to ``/v1/models`` for servers that have no
health route) and its model list, read off the request path every ``health_interval_s``.

An answer marks an upstream down at once (a 503 "Loading model", a refused connection): the server said
so. A probe that got no answer (timed out, or its connection dropped) does not, on its own: a pooled
connection the server had just closed is resent once, as on the request path, and a healthy upstream
is marked down only after :data:`SILENT_PROBES_TO_DOWN` polls in a row went unanswered. A server busy
enough to answer its probe late is still serving; taking it out for a poll interval would refuse every
request meanwhile.

What went wrong is kept twice: ``health_error`` in words that name no host (``/health failed:
ClientConnectorError``), which ``/readyz`` shows to anyone who can reach it, and ``health_detail``, the
exception's own words (they name the host and port), for ``/state`` and the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from gateway.common.resend import resend_if_stale
from gateway.server.parts import Gateway
from gateway.server.upstream.pool import Upstream
from gateway.server.upstream.upstream_headers import poll_headers

log = logging.getLogger("sweetspot.upstreams")

SILENT_PROBES_TO_DOWN = 2


def health_tick(gateway: Gateway) -> Callable[[], Awaitable[None]]:
    """One poll of every upstream, then a dispatch: an upstream that came back can take queued requests."""

    async def tick() -> None:
        timeout = max(min(gateway.settings.health_interval_s, 5.0), 1.0)
        headers = poll_headers(gateway.settings.upstream_api_key)
        await asyncio.gather(
            *(check_health(gateway.client.poll_session, upstream, headers, timeout) for upstream in gateway.pool)
        )
        gateway.queue.dispatch()

    return tick


async def check_health(
    session: aiohttp.ClientSession, upstream: Upstream, headers: dict[str, str], timeout_s: float
) -> None:
    """Poll one upstream once: health first, then its model list. Updates ``upstream`` in place."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    healthy: bool | None = False  # None: the server has no /health route; its model list decides
    error: str | None = None  # what went wrong, in words that name no host (/readyz shows it)
    detail: str | None = None  # the exception's own words, which may name the host and port (/state, the log)
    silent = False  # no answer at all: timed out or dropped
    try:
        status = await _get_health(session, f"{upstream.url}/health", headers, timeout)
        healthy = None if status == 404 else status == 200
        if healthy is False:
            error = f"/health answered {status}"
    except aiohttp.ClientConnectorError as exc:  # refused: nothing listens
        error, detail = f"/health failed: {type(exc).__name__}", str(exc) or None
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        error, detail = f"/health failed: {type(exc).__name__}", str(exc) or None
        silent = True
    if healthy is not False:
        models, models_error, models_detail = await _list_models(session, upstream.url, headers, timeout)
        upstream.models = models
        if healthy is None:
            healthy, error, detail = models is not None, models_error, models_detail
    was = upstream.healthy
    upstream.silent_probes = upstream.silent_probes + 1 if silent else 0
    if silent and was and upstream.silent_probes < SILENT_PROBES_TO_DOWN:
        healthy = True  # one unanswered probe of a serving upstream: wait for the next poll
    now = time.monotonic()
    if healthy and not was and now < upstream.down_until:
        # taken out by the request path: not back yet
        healthy, error, detail = False, upstream.health_error, upstream.health_detail
    if healthy and not was:
        upstream.timeouts_in_a_row = 0
    upstream.healthy = bool(healthy)
    shown = not healthy or silent
    upstream.health_error = error if shown else None
    upstream.health_detail = detail if shown else None
    upstream.last_health_check = now
    if was != upstream.healthy:
        log.warning(
            "upstream %s is now %s%s",
            upstream.url,
            "healthy" if healthy else "unhealthy",
            f" ({error}{f': {detail}' if detail else ''})" if error and not healthy else "",
        )


async def _get_health(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], timeout: aiohttp.ClientTimeout
) -> int:
    """GET the health route; its status. A connection dropped before the answer is tried once more (the
    pooled one was closed by the server while idle, like llama-server's after 5 s)."""

    async def attempt() -> int:
        async with session.get(url, headers=headers, timeout=timeout) as resp:
            await resp.read()
            return resp.status

    return await resend_if_stale(attempt, resends=1)


async def _list_models(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], timeout: aiohttp.ClientTimeout
) -> tuple[list[dict[str, Any]] | None, str | None, str | None]:
    """The model list, or None with the error (naming no host) and the exception's own words."""
    try:
        async with session.get(f"{url}/v1/models", headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                return None, f"/v1/models answered {resp.status}", None
            payload = await resp.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        return None, f"/v1/models failed: {type(exc).__name__}", str(exc) or None
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return None, "/v1/models answered without a data list", None
    return [entry for entry in data if isinstance(entry, dict)], None, None
