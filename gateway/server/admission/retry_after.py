"""Retry-After for a request refused because others are ahead of it: how long until it would likely run.

The admission queue answers it for the whole queue, a tenant over its own queue cap for its own requests
(another tenant's traffic says nothing about this one's turn): both ask the same question of a different
stream of releases, so both use :class:`ReleaseRate`.
"""

from __future__ import annotations

import math
from collections import deque

#: Seconds of past releases a drain rate is measured over.
DRAIN_HORIZON_S = 30.0
#: Retry-After when nothing was released lately: no rate to extrapolate from, so a modest wait.
NO_RATE_RETRY_S = 5
#: Retry-After's bounds: at least a second (the header is whole seconds), at most a minute (a longer answer
#: is a guess, and a client told to wait long goes elsewhere).
RETRY_MIN_S, RETRY_MAX_S = 1, 60


class ReleaseRate:
    """Release times over the last ``horizon_s`` seconds; pruned as they are added, so memory is flat."""

    __slots__ = ("_times", "horizon_s")

    def __init__(self, horizon_s: float = DRAIN_HORIZON_S) -> None:
        self.horizon_s = horizon_s
        self._times: deque[float] = deque()

    def __len__(self) -> int:
        return len(self._times)

    def add(self, now: float) -> None:
        self._times.append(now)
        self._forget(now)

    def _forget(self, now: float) -> None:
        cutoff = now - self.horizon_s
        times = self._times
        while times and times[0] < cutoff:
            times.popleft()

    def per_second(self, now: float) -> float:
        """Releases per second over the recent past (at least a second's span, so one release is not a burst)."""
        self._forget(now)
        if not self._times:
            return 0.0
        return len(self._times) / max(now - self._times[0], 1.0)

    def retry_after(self, ahead: int, now: float) -> int:
        """Whole seconds until a request joining behind ``ahead`` others would likely run, within 1..60."""
        rate = self.per_second(now)
        if rate <= 0:
            return NO_RATE_RETRY_S
        return int(min(max(math.ceil((ahead + 1) / rate), RETRY_MIN_S), RETRY_MAX_S))
