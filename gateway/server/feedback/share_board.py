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

Nothing read from the board is trusted (:func:`check_entry`): whoever can write to Redis can write anything
there, and one bad entry must not freeze the fleet (an entry with ``nan`` made every tick raise; one
with an absurd demand pinned every replica's share to 1; one dated ``inf`` never expired). An entry is
taken only when its field is a replica id of the form the gateway writes (``host:pid``) and its value
three finite, non-negative numbers in range: a whole limit within this replica's ``limit_min`` ..
``limit_max``, a demand of at most ``limit_max + max_queue`` (:class:`Bounds`: the most a replica
configured like this one can have, its limit's worth in flight and a full queue), and a time at most
``CLOCK_SKEW_S`` ahead of this replica's clock. Anything else is deleted from Redis and counted by
reason (``REJECT_REASONS``; ``sweetspot_share_board_rejected_entries_total``); a key of the wrong
type is deleted whole. Validation stops the impossible, not a plausible lie: access to the Redis is
what admits a writer to the fleet.

The keys are ``sweetspot:share:<namespace>:<upstream URL>``: replicas share only within a namespace
(``share_namespace``; by default :func:`default_namespace`, a hash of the configuration the entries are
checked against), so two fleets in front of the same URL do not mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gateway.control.share import Entry, Peers

log = logging.getLogger("sweetspot.share")

TIMEOUT_S = 0.5  # a tick waits no longer for Redis than this
KEY_PREFIX = "sweetspot:share:"
#: How far ahead of this replica's clock another's entry may be dated. The age check (``share_ttl_s``, 10 s)
#: already takes the replicas' clocks to agree within a fraction of it; NTP keeps hosts within milliseconds, and
#: 2 s is room for a clock being stepped. An entry from the future outlives the TTL by at most this.
CLOCK_SKEW_S = 2.0
#: The longest value an entry may have: the gateway writes three numbers, under 40 characters.
VALUE_MAX_BYTES = 64
#: Why an entry was rejected: the ``reason`` label of ``sweetspot_share_board_rejected_entries_total``.
#: ``replica_id``: the field is not ``host:pid``; ``malformed``: not three numbers (garbage bytes, a missing
#: field, a fractional limit), or the key is not a hash; ``not_finite``: nan or inf; ``out_of_range``: negative, a
#: limit outside limit_min..limit_max, a demand over ``Bounds.demand_max``; ``future``: dated over
#: ``CLOCK_SKEW_S`` ahead.
REJECT_REASONS = ("replica_id", "malformed", "not_finite", "out_of_range", "future")
#: What :func:`replica_id` writes: a hostname's characters (RFC 1123 and the underscore) and a pid.
REPLICA_ID = re.compile(r"[A-Za-z0-9._-]{1,253}:[0-9]{1,10}")
#: A namespace: the characters of a hostname, no colon (it ends the namespace in the key).
NAMESPACE = re.compile(r"[A-Za-z0-9._-]{1,64}")
# A decimal number as Python's repr and %g write it, nan and inf included (they are rejected as not finite, not
# as garbage); float() alone would also take "1_000", " 5" and "٣".
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|inf|infinity)", re.IGNORECASE)


def replica_id() -> str:
    """Unique per process: a pod's hostname, and the worker's pid (``--workers`` runs several per pod). A
    character outside :data:`REPLICA_ID`'s becomes ``-``, so the id is one the other replicas accept."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:253] or "host"
    return f"{host}:{os.getpid()}"


def default_namespace(upstreams: Iterable[str], limit_min: int, limit_max: int, max_queue: int) -> str:
    """The namespace of a fleet that sets none: 12 hex digits of a hash of its upstream URLs (sorted) and the
    settings its entries are checked against (:class:`Bounds`). Replicas configured alike, the one fleet of
    today's deployments, share; replicas configured differently never read entries they would reject, and a
    rollout that changes these settings runs the old and the new replicas each on their own until it ends."""
    basis = {"upstreams": sorted(set(upstreams)), "limit": [limit_min, limit_max], "max_queue": max_queue}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Bounds:
    """What another replica's entry may hold, from this replica's settings: a limit within ``limit_min`` ..
    ``limit_max`` (every limit the gateway sets is), and a demand of at most ``demand_max``."""

    limit_min: int
    limit_max: int
    demand_max: float

    @classmethod
    def of(cls, limit_min: int, limit_max: int, max_queue: int) -> Bounds:
        """A replica's demand is its requests in flight, at most its limit (so ``limit_max``), plus those queued
        for the upstream, at most ``max_queue``: more than ``limit_max + max_queue`` no replica of the fleet can
        publish. Anything tighter would reject a replica whose queue fills; anything looser lets one entry
        shrink every other replica's share toward nothing (1e9 pinned them all to 1)."""
        return cls(limit_min, limit_max, limit_max + max_queue)


def check_entry(field: bytes, value: bytes, now: float, bounds: Bounds) -> Entry | str:
    """The entry ``field: value`` read from the board, or why it is rejected (one of ``REJECT_REASONS``).
    Its age is not judged here: a stale entry is no error (its replica went away)."""
    try:
        replica = field.decode("ascii")
    except (UnicodeDecodeError, AttributeError):
        return "replica_id"
    if not REPLICA_ID.fullmatch(replica):
        return "replica_id"
    if not isinstance(value, bytes) or len(value) > VALUE_MAX_BYTES:
        return "malformed"
    try:
        parts = value.decode("ascii").split(" ")
    except UnicodeDecodeError:
        return "malformed"
    if len(parts) != 3 or not all(_NUMBER.fullmatch(part) for part in parts):
        return "malformed"
    demand, limit, at = (float(part) for part in parts)
    if not all(math.isfinite(number) for number in (demand, limit, at)):
        return "not_finite"
    if not limit.is_integer():
        return "malformed"
    if min(demand, limit, at) < 0 or not bounds.limit_min <= limit <= bounds.limit_max or demand > bounds.demand_max:
        return "out_of_range"
    if at > now + CLOCK_SKEW_S:
        return "future"
    return Entry(demand, int(limit), at, replica)


class ShareBoard:
    """One replica's view of the Redis board (``redis.asyncio``, imported only when configured).

    ``bounds`` and ``namespace`` as the module says; ``on_reject(upstream, reason)`` hears of each entry rejected."""

    def __init__(
        self,
        url: str,
        ttl_s: float,
        *,
        bounds: Bounds,
        namespace: str,
        replica: str | None = None,
        wall_clock: Callable[[], float] = time.time,
        client: Any = None,
        on_reject: Callable[[str, str], None] | None = None,
    ) -> None:
        if not NAMESPACE.fullmatch(namespace):
            raise ValueError(f"share namespace {namespace!r} is not 1-64 of A-Z a-z 0-9 . _ -")
        replica = replica or replica_id()
        if not REPLICA_ID.fullmatch(replica):
            raise ValueError(f"replica id {replica!r} is not host:pid (the other replicas would reject it)")
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
        self.bounds = bounds
        self.namespace = namespace
        self.replica = replica
        self._clock = wall_clock
        self._on_reject = on_reject
        self._upstreams: set[str] = set()
        self._warned: set[str] = set()  # the reasons already logged: the metric counts every one
        self.failing = False

    def key(self, upstream: str) -> str:
        return f"{KEY_PREFIX}{self.namespace}:{upstream}"

    async def exchange(self, upstream: str, demand: float, limit: int) -> Peers | None:
        """Publish this replica's numbers for ``upstream`` and read the other replicas' (None on any failure)."""
        key = self.key(upstream)
        now = self._clock()
        self._upstreams.add(upstream)
        try:
            async with asyncio.timeout(TIMEOUT_S * 2):
                pipe = self._redis.pipeline(transaction=False)
                pipe.hset(key, self.replica, f"{demand:g} {limit} {now:.3f}")
                pipe.expire(key, max(1, round(3 * self.ttl_s)))
                pipe.hgetall(key)
                _, _, raw = await pipe.execute()
                entries, drop, rejected = _parse(raw, self.replica, now, self.ttl_s, self.bounds)
                self._rejected(upstream, rejected)
                if drop:
                    await self._redis.hdel(key, *drop)
            peers = Peers.of(entries, now, Entry(demand, limit, now, self.replica))
        except Exception as exc:  # noqa: BLE001 - any failure of the optional board degrades to "no peers"
            if "WRONGTYPE" in str(exc):  # someone wrote the key as something other than a hash: it goes whole
                self._rejected(upstream, ["malformed"])
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(TIMEOUT_S):
                        await self._redis.delete(key)
                return None  # Redis answers: not an outage; the next tick writes the hash again
            if not self.failing:
                log.warning(
                    "shared state unavailable, each replica on its own until it is back", extra={"error": repr(exc)}
                )
            self.failing = True
            return None
        if self.failing:
            log.info("shared state back")
            self.failing = False
        return peers

    def _rejected(self, upstream: str, reasons: list[str]) -> None:
        for reason in reasons:
            if self._on_reject is not None:
                self._on_reject(upstream, reason)
            if reason not in self._warned:
                self._warned.add(reason)
                log.warning(
                    "rejected an entry of the shared state (deleted; counted from now on, not logged again)",
                    extra={"upstream": upstream, "reason": reason},
                )

    async def leave(self) -> None:
        """Remove this replica's entries (on shutdown), so the others take its share at once."""
        try:
            async with asyncio.timeout(TIMEOUT_S * 2):
                for upstream in self._upstreams:
                    await self._redis.hdel(self.key(upstream), self.replica)
        except Exception:  # noqa: BLE001 - the entries expire anyway
            pass

    async def close(self) -> None:
        # On shutdown, whatever state the connection is in (Redis gone, a socket error): nothing is left to do.
        with contextlib.suppress(Exception):
            await self._redis.aclose()


def _parse(
    raw: dict[bytes, bytes], me: str, now: float, ttl_s: float, bounds: Bounds
) -> tuple[list[Entry], list[bytes], list[str]]:
    """The other replicas' fresh entries; the fields to delete (stale or rejected); why each rejected one was."""
    mine = me.encode()
    entries: list[Entry] = []
    drop: list[bytes] = []
    rejected: list[str] = []
    for field, value in raw.items():
        if field == mine:
            continue
        checked = check_entry(field, value, now, bounds)
        if isinstance(checked, str):
            drop.append(field)
            rejected.append(checked)
        elif now - checked.at > ttl_s:
            drop.append(field)
        else:
            entries.append(checked)
    return entries, drop, rejected
