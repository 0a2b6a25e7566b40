"""The replicas' shared state in Redis: each upstream's demand and limit, per replica.

Each control tick a replica writes its entry for every upstream (in flight plus queued, its limit, the
wall-clock time) into one Redis hash per upstream and reads the others' back, in one round trip; the
controller reads from them whether it leads the replicas' knee search or follows the leader's limit,
scaled by demand (:mod:`gateway.control.share`); the fields are the replicas' ids, whose order picks the
leader. Wall-clock time,
because the entries cross hosts: an entry older than ``share_ttl_s`` is ignored and deleted, so a replica
that went away (scaled down, killed) stops counting within that time, and the hash itself expires when
nobody writes it.

Redis is optional and may go away at any time: every failure (refused, reset, a timeout of
``TIMEOUT_S``) makes this tick's answer "no peers known", which is the controller's no-Redis path, logged
once when the outage starts and once when it ends. The next tick simply tries again (redis-py
reconnects). Nothing here is on the request path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from gateway.control.share import Entry, Peers

log = logging.getLogger("sweetspot.share")

TIMEOUT_S = 0.5  # a tick waits no longer for Redis than this
KEY_PREFIX = "sweetspot:share:"


def replica_id() -> str:
    """Unique per process: a pod's hostname, and the worker's pid (``--workers`` runs several per pod)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ShareBoard:
    """One replica's view of the Redis board (``redis.asyncio``, imported only when configured)."""

    def __init__(
        self,
        url: str,
        ttl_s: float,
        *,
        replica: str | None = None,
        wall_clock: Callable[[], float] = time.time,
        client: Any = None,
    ) -> None:
        if client is None:
            try:
                import redis.asyncio as aioredis
                from redis.asyncio.retry import Retry
                from redis.backoff import NoBackoff
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise ValueError(
                    "share_redis_url needs the redis client: pip install 'sweetspot-gateway[share]'"
                ) from exc
            # One immediate retry, no backoff: after Redis restarts, the first command finds its pooled connection
            # closed and goes again on a new one; anything longer is the next tick's business (redis-py 6+ would
            # otherwise retry with backoff past the tick's timeout).
            client = aioredis.Redis.from_url(
                url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S, retry=Retry(NoBackoff(), 1)
            )
        self._redis = client
        self.ttl_s = ttl_s
        self.replica = replica or replica_id()
        self._clock = wall_clock
        self._upstreams: set[str] = set()
        self.failing = False

    async def exchange(self, upstream: str, demand: float, limit: int) -> Peers | None:
        """Publish this replica's numbers for ``upstream`` and read the other replicas' (None on any failure)."""
        key = KEY_PREFIX + upstream
        now = self._clock()
        self._upstreams.add(upstream)
        try:
            async with asyncio.timeout(TIMEOUT_S * 2):
                pipe = self._redis.pipeline(transaction=False)
                pipe.hset(key, self.replica, f"{demand:g} {limit} {now:.3f}")
                pipe.expire(key, max(1, round(3 * self.ttl_s)))
                pipe.hgetall(key)
                _, _, raw = await pipe.execute()
                entries, stale = _parse(raw, self.replica, now, self.ttl_s)
                if stale:
                    await self._redis.hdel(key, *stale)
        except Exception as exc:  # noqa: BLE001 - any failure of the optional board degrades to "no peers"
            if not self.failing:
                log.warning(
                    "shared state unavailable, each replica on its own until it is back", extra={"error": repr(exc)}
                )
            self.failing = True
            return None
        if self.failing:
            log.info("shared state back")
            self.failing = False
        return Peers.of(entries, now, Entry(demand, limit, now, self.replica))

    async def leave(self) -> None:
        """Remove this replica's entries (on shutdown), so the others take its share at once."""
        try:
            async with asyncio.timeout(TIMEOUT_S * 2):
                for upstream in self._upstreams:
                    await self._redis.hdel(KEY_PREFIX + upstream, self.replica)
        except Exception:  # noqa: BLE001 - the entries expire anyway
            pass

    async def close(self) -> None:
        try:
            await self._redis.aclose()
        except Exception:  # noqa: BLE001
            pass


def _parse(raw: dict[bytes, bytes], me: str, now: float, ttl_s: float) -> tuple[list[Entry], list[bytes]]:
    """The other replicas' fresh entries, and the fields of stale (or unreadable) ones to delete."""
    entries, stale = [], []
    for field, value in raw.items():
        if field.decode(errors="replace") == me:
            continue
        try:
            demand, limit, at = value.decode().split()
            entry = Entry(float(demand), int(limit), float(at), field.decode())
        except (ValueError, UnicodeDecodeError):
            stale.append(field)
            continue
        if now - entry.at > ttl_s:
            stale.append(field)
        else:
            entries.append(entry)
    return entries, stale
