"""The periodic loops of a running gateway (health poll, backend scrape, NVML read, controller tick).

Each loop is a plain coroutine run as a task for the app's lifetime; a failing iteration is logged
and the loop carries on, so a bug in a poller can never take the request path down with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("sweetspot.loops")


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
