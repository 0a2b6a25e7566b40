"""Which upstream created each stored response, so a request that refers to one reaches it.

The Responses API keeps state on the server that answered: ``previous_response_id``, ``GET
/v1/responses/{id}`` and ``.../cancel`` only work there. The map is bounded (the oldest entries go first)
and entries expire, so it costs a fixed amount of memory however many responses pass through.

With client keys (``owned``), a stored response is also its tenant's: the map records who created each id,
and for anyone else the id does not exist. A backend knows no tenants (any caller may read, delete or continue
any id it stores), so the gateway is the only place that can keep them apart, and it keeps apart only what it
saw created: an id it does not know is nobody's, to every tenant.

A response id names a path segment upstream (``/v1/responses/{id}``): :data:`RESPONSE_ID` is the only form
the gateway passes on, the characters vLLM's and OpenAI's ids use, bounded, so no ``..`` or ``/`` ever
reaches the upstream's path.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

#: The form of a response id the gateway passes on (vLLM: ``resp_`` and 32 hex digits; OpenAI: ``resp_`` and 48).
RESPONSE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class Owner(Protocol):
    """Who creates and reads stored responses: a tenant, by its name."""

    @property
    def name(self) -> str: ...


class ResponseAffinity:
    def __init__(
        self, *, max_entries: int, ttl_s: float, owned: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max = max_entries
        self._ttl_s = ttl_s
        self._clock = clock
        #: Tenants are credentials (client keys are configured): each stored response is its creator's only.
        self.owned = owned
        # id -> (upstream, owning tenant's name or None, expires at)
        self._owners: OrderedDict[str, tuple[str, str | None, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def remember(self, response_id: str, upstream: str, owner: Owner | None = None) -> None:
        now = self._clock()
        self._owners[response_id] = (upstream, self._name(owner), now + self._ttl_s)
        self._owners.move_to_end(response_id)
        while len(self._owners) > self._max:
            self._owners.popitem(last=False)
        self._expire(now)

    def upstream_of(self, response_id: str, owner: Owner | None = None) -> str | None:
        """The upstream that created ``response_id``, or None (never seen, evicted, expired, or, when
        ``owned``, created by another tenant than ``owner``)."""
        found = self._owners.get(response_id)
        if found is None:
            return None
        upstream, created_by, expires = found
        if expires <= self._clock():
            del self._owners[response_id]
            return None
        if created_by != self._name(owner):
            return None
        return upstream

    def _name(self, owner: Owner | None) -> str | None:
        return owner.name if self.owned and owner is not None else None

    def _expire(self, now: float) -> None:
        """Drop expired entries from the old end (entries are kept in the order they were last written)."""
        while self._owners:
            response_id, (_, _, expires) = next(iter(self._owners.items()))
            if expires > now:
                return
            del self._owners[response_id]
