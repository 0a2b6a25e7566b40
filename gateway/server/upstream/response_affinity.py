"""Which upstream created each stored response, so a request that refers to one reaches it.

The Responses API keeps state on the server that answered: ``previous_response_id``, ``GET
/v1/responses/{id}`` and ``.../cancel`` only work there. The map is bounded (the oldest entries go first)
and entries expire, so it costs a fixed amount of memory however many responses pass through.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class ResponseAffinity:
    def __init__(self, *, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_entries
        self._ttl_s = ttl_s
        self._clock = clock
        self._owners: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (upstream, expires at)

    def __len__(self) -> int:
        return len(self._owners)

    def remember(self, response_id: str, upstream: str) -> None:
        now = self._clock()
        self._owners[response_id] = (upstream, now + self._ttl_s)
        self._owners.move_to_end(response_id)
        while len(self._owners) > self._max:
            self._owners.popitem(last=False)
        self._expire(now)

    def upstream_of(self, response_id: str) -> str | None:
        """The upstream that created ``response_id``, or None (never seen, evicted or expired)."""
        found = self._owners.get(response_id)
        if found is None:
            return None
        upstream, expires = found
        if expires <= self._clock():
            del self._owners[response_id]
            return None
        return upstream

    def _expire(self, now: float) -> None:
        """Drop expired entries from the old end (entries are kept in the order they were last written)."""
        while self._owners:
            response_id, (_, expires) = next(iter(self._owners.items()))
            if expires > now:
                return
            del self._owners[response_id]
