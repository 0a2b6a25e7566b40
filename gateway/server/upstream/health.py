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

Models come and go (vLLM loads and unloads LoRA adapters at run time): each poll replaces an upstream's model
list with the one it read, so a model loaded is routable, and one unloaded no longer routed, within a poll
interval. A request that an upstream answers 404 "the model does not exist" reads that upstream's list at once
(:func:`refresh_models`), at most one read in flight and one begun per :data:`REFRESH_MIN_INTERVAL_S` per
upstream, so a stream of such requests costs the upstream one ``GET /v1/models`` a second at most.
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
#: The least time between two model-list reads of one upstream asked for by requests (404 "model not found").
REFRESH_MIN_INTERVAL_S = 1.0


def health_tick(gateway: Gateway) -> Callable[[], Awaitable[None]]:
    """One poll of every upstream, then a dispatch: an upstream that came back can take queued requests."""

    async def tick() -> None:
        timeout = max(min(gateway.settings.health_interval_s, 5.0), 1.0)
        headers = poll_headers(gateway.settings.upstream_api_key)
        await asyncio.gather(
            *(
                check_health(gateway.client.poll_session, upstream, headers, timeout)
                for upstream in gateway.pool
                if not upstream.retiring  # leaving: the poll must not bring it back into rotation
            )
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
    if upstream.retiring:
        return  # removed from the configuration while this poll ran: it stays out of rotation
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


def refresh_models(gateway: Gateway, upstream: Upstream) -> bool:
    """Read ``upstream``'s model list now, off the request path (the request that asked does not wait): an
    upstream answered 404 for a model its list named. Nothing is started while a read is in flight or within
    :data:`REFRESH_MIN_INTERVAL_S` of the last one begun here; returns whether one was. A list that cannot be read
    leaves the one known (the health poll decides about the upstream itself)."""
    now = gateway.clock()
    if upstream.models_refresh is not None or now - upstream.models_refreshed_at < REFRESH_MIN_INTERVAL_S:
        return False
    upstream.models_refreshed_at = now
    upstream.models_refresh = asyncio.get_running_loop().create_task(_refresh(gateway, upstream))
    return True


async def _refresh(gateway: Gateway, upstream: Upstream) -> None:
    timeout = aiohttp.ClientTimeout(total=max(min(gateway.settings.health_interval_s, 5.0), 1.0))
    headers = poll_headers(gateway.settings.upstream_api_key)
    try:
        models, error, detail = await _list_models(gateway.client.poll_session, upstream.url, headers, timeout)
    except Exception:  # noqa: BLE001 (a session closed under it at shutdown): the next poll reads it
        models, error, detail = None, "model list refresh failed", None
    finally:
        upstream.models_refresh = None
    if models is None:
        log.info("upstream %s: model list not refreshed (%s%s)", upstream.url, error, f": {detail}" if detail else "")
        return
    upstream.models = models  # a new list, never the old one changed: Upstream.lists sees the change


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
