"""A mean over the recent past: values kept with the time each was read, for as long as asked.

The controller averages per-tick ratios over a stretch of time in more than one place (KV usage per
running sequence, tokens/s per slot): a scrape or a tick alone reads where the running requests happen
to be in their lives, a mean over a span of them does not.
"""

from __future__ import annotations

import math
from collections import deque


class TimedMean:
    """Values read at known times, each kept ``keep_s``; the mean of those read since a given time."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._values: deque[tuple[float, float]] = deque()  # (when read, value), oldest first

    def add(self, now: float, value: float) -> None:
        self._values.append((now, value))
        self.forget(now)

    def forget(self, now: float) -> None:
        """Drop the values read more than ``keep_s`` before ``now``."""
        values, oldest = self._values, now - self.keep_s
        while values and values[0][0] < oldest:
            values.popleft()

    def mean(self, since: float = -math.inf) -> float | None:
        """The mean of the values read at ``since`` or later (None when there are none)."""
        chosen = [value for at, value in self._values if at >= since]
        return sum(chosen) / len(chosen) if chosen else None
