"""Graceful drain on SIGTERM, so a rollout cuts nothing.

The moment the signal arrives: ``/readyz`` answers 503 (the load balancer stops sending new clients), new
requests get an OpenAI-shaped 503 with ``Retry-After`` and ``Connection: close`` (a retrying SDK reconnects,
landing on another replica), and every request still queued gets the same 503. Requests already running
go on: streams run to their end, and so do the light requests (tokenize, stored responses, pass-through
paths), which hold no permit but are counted while they run. When none is left, or at ``drain_timeout_s``, the
server shuts down; a generation still running at the deadline is interrupted (:meth:`RequestWatch.interrupt`):
a stream ends with an error event saying the gateway is shutting down, a buffered request gets the 503 (a light
request has its own short timeout).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.server.admission.refusals import ShuttingDown
from gateway.server.relay.request_watch import RequestWatch

if TYPE_CHECKING:
    from gateway.server.parts import Gateway

log = logging.getLogger("sweetspot.drain")

#: Retry-After on the drain's 503s: the client should come back at once, through another replica.
DRAIN_RETRY_AFTER_S = 1
#: After interrupting the last requests, how long to wait for them to send their error and release.
SETTLE_S = 5.0


@dataclass
class DrainState:
    """Whether the gateway is draining, the generation requests running now (each one's :class:`RequestWatch`),
    and how many light requests (no permit, no watch: :mod:`gateway.server.routes.light`) are running."""

    draining: bool = False
    running: set[RequestWatch] = field(default_factory=set)
    light: int = 0


def shutting_down() -> ShuttingDown:
    return ShuttingDown(
        "the gateway is shutting down; retry (another replica will answer)", retry_after_s=DRAIN_RETRY_AFTER_S
    )


def inflight(gateway: Gateway) -> int:
    """Requests the drain waits for: generations holding permits, and light requests."""
    return sum(upstream.limiter.inflight for upstream in gateway.pool) + gateway.drain.light


async def drain(gateway: Gateway, timeout_s: float) -> None:
    """Refuse new work, let running requests finish within ``timeout_s``, interrupt the rest."""
    gateway.drain.draining = True
    gateway.queue.close(shutting_down)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    log.info("draining: %d requests running, up to %.0f s", inflight(gateway), timeout_s)
    while inflight(gateway) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    left = list(gateway.drain.running)
    if left:
        log.warning("drain deadline: interrupting %d running requests", len(left))
        for watch in left:
            watch.interrupt()
        settle = loop.time() + SETTLE_S
        while gateway.drain.running and loop.time() < settle:
            await asyncio.sleep(0.05)
    log.info("drained")
