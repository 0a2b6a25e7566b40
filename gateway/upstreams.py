"""The upstreams the gateway knows: their limiter, measurement window, health and served models.

Health is polled off the request path (``/health``, falling back to ``/v1/models`` for servers that
have no health route). Models are learned from ``/v1/models`` so a request for a model no upstream
serves gets a 404 instead of a slot, and so a request goes only to upstreams that serve its model.

An answer marks an upstream down at once (a 503 "Loading model", a refused connection): the server said
so. A probe that got no answer (timed out, or its connection dropped) does not, on its own: a pooled
connection the server had just closed is resent once, as on the request path, and a healthy upstream
is marked down only after :data:`SILENT_PROBES_TO_DOWN` polls in a row went unanswered. A server busy
enough to answer its probe late is still serving; taking it out for a poll interval would refuse every
request meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.admission import Limiter
from gateway.control.window import SlidingWindow
from gateway.resend import resend_if_stale

log = logging.getLogger("sweetspot.upstreams")

SILENT_PROBES_TO_DOWN = 2


@dataclass
class Upstream:
    """One backend server and everything the gateway tracks about it."""

    url: str
    limiter: Limiter
    window: SlidingWindow
    models: list[dict[str, Any]] | None = None  # None: not known (listing failed or unsupported)
    health_error: str | None = None
    last_health_check: float | None = None
    silent_probes: int = 0  # health polls in a row that got no answer
    # Streams may stay on pooled connections: set once the backend is known to keep a connection usable
    # after a streamed reply (vLLM). Until then, and for llama-server, streams ask for "Connection: close".
    streams_keep_alive: bool = False

    @property
    def name(self) -> str:
        return self.url

    @property
    def healthy(self) -> bool:
        return self.limiter.healthy

    def serves(self, model: str) -> bool:
        """Unknown model lists serve everything: never refuse on missing information."""
        return self.models is None or any(entry.get("id") == model for entry in self.models)


class UpstreamPool:
    """All upstreams, looked up by URL, plus the health/model polling they need."""

    def __init__(self, upstreams: list[Upstream]) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is required")
        self.upstreams = upstreams
        self.by_name = {upstream.name: upstream for upstream in upstreams}

    def __iter__(self):
        return iter(self.upstreams)

    def eligible(self, model: str) -> list[str]:
        return [upstream.name for upstream in self.upstreams if upstream.serves(model)]

    def models_known(self) -> bool:
        return all(upstream.models is not None for upstream in self.upstreams)

    def all_models(self) -> list[dict[str, Any]]:
        """The union of the upstreams' model lists, first listing wins for duplicate ids."""
        seen: dict[str, dict[str, Any]] = {}
        for upstream in self.upstreams:
            for entry in upstream.models or []:
                seen.setdefault(str(entry.get("id")), entry)
        return list(seen.values())

    def any_healthy(self) -> bool:
        return any(upstream.healthy for upstream in self.upstreams)


async def check_health(
    session: aiohttp.ClientSession, upstream: Upstream, headers: dict[str, str], timeout_s: float
) -> None:
    """Poll one upstream once: health first, then its model list. Updates ``upstream`` in place."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    healthy: bool | None = False  # None: the server has no /health route; its model list decides
    error: str | None = None
    silent = False  # no answer at all: timed out or dropped
    try:
        status = await _get_health(session, f"{upstream.url}/health", headers, timeout)
        healthy = None if status == 404 else status == 200
        if healthy is False:
            error = f"/health answered {status}"
    except aiohttp.ClientConnectorError as exc:  # refused: nothing listens
        error = f"/health failed: {type(exc).__name__}: {exc}"
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        error = f"/health failed: {type(exc).__name__}: {exc}"
        silent = True
    if healthy is not False:
        models, models_error = await _list_models(session, upstream.url, headers, timeout)
        upstream.models = models
        if healthy is None:
            healthy, error = models is not None, models_error
    was = upstream.limiter.healthy
    upstream.silent_probes = upstream.silent_probes + 1 if silent else 0
    if silent and was and upstream.silent_probes < SILENT_PROBES_TO_DOWN:
        healthy = True  # one unanswered probe of a serving upstream: wait for the next poll
    upstream.limiter.healthy = bool(healthy)
    upstream.health_error = error if (not healthy or silent) else None
    upstream.last_health_check = time.monotonic()
    if was != upstream.limiter.healthy:
        log.warning(
            "upstream %s is now %s%s", upstream.url, "healthy" if healthy else "unhealthy",
            f" ({error})" if error and not healthy else "",
        )


async def _get_health(session: aiohttp.ClientSession, url: str, headers: dict[str, str],
                      timeout: aiohttp.ClientTimeout) -> int:
    """GET the health route; its status. A connection dropped before the answer is tried once more (the
    pooled one was closed by the server while idle, like llama-server's after 5 s)."""
    async def attempt() -> int:
        async with session.get(url, headers=headers, timeout=timeout) as resp:
            await resp.read()
            return resp.status

    return await resend_if_stale(attempt, resends=1)


async def _list_models(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], timeout: aiohttp.ClientTimeout
) -> tuple[list[dict[str, Any]] | None, str | None]:
    try:
        async with session.get(f"{url}/v1/models", headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                return None, f"/v1/models answered {resp.status}"
            payload = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        return None, f"/v1/models failed: {type(exc).__name__}: {exc}"
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return None, "/v1/models answered without a data list"
    return [entry for entry in data if isinstance(entry, dict)], None
