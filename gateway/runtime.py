"""Background work of a running gateway: health polling and whatever periodic loops the app adds.

Each loop is a plain coroutine run as a task for the app's lifetime; a failing iteration is logged
and the loop carries on, so a bug in a poller can never take the request path down with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gateway.core import Gateway
from gateway.upstreams import check_health

log = logging.getLogger("sweetspot.runtime")


async def every(interval_s: float, tick: Callable[[], Awaitable[None]], name: str) -> None:
    """Run ``tick`` every ``interval_s`` seconds until cancelled."""
    while True:
        try:
            await tick()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; retrying in %.1fs", name, interval_s)
        await asyncio.sleep(interval_s)


def health_tick(gateway: Gateway) -> Callable[[], Awaitable[None]]:
    async def tick() -> None:
        timeout = max(min(gateway.settings.health_interval_s, 5.0), 1.0)
        await asyncio.gather(*(
            check_health(gateway.client.session, upstream, gateway.poll_headers(), timeout)
            for upstream in gateway.pool
        ))
        # An upstream that came back can take queued requests now.
        gateway.queue.dispatch()

    return tick
