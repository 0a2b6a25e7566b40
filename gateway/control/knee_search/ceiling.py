"""The ceiling: a limit above which the controller does not step for a while after congestion there.

Without it, the next re-probe would walk straight back into the limit that just breached a
latency objective or the KV headroom, and the controller would oscillate around the cliff instead of
sitting at the knee. It expires on its own, so a backend that recovered is found again. Time is a
parameter, like everywhere in :mod:`gateway.control`.
"""

from __future__ import annotations


class Ceiling:
    """The highest limit an increase may reach, until a given time; ``value`` is None when there is none."""

    __slots__ = ("until", "value")

    def __init__(self) -> None:
        self.value: int | None = None
        self.until = 0.0

    def set(self, now: float, ceiling: int, *, floor: int, hold_s: float) -> None:
        """Keep increases at or below ``ceiling`` (never below ``floor``) for ``hold_s`` from ``now``."""
        self.value = max(ceiling, floor)
        self.until = now + hold_s

    def clear(self) -> None:
        self.value = None

    def at(self, now: float) -> int | None:
        """The ceiling in force at ``now`` (forgotten once it expired)."""
        if self.value is not None and now >= self.until:
            self.value = None
        return self.value
