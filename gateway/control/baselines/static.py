"""A fixed concurrency limit: what an operator configures by hand.

Two of the baselines are this one class: static at the sweet spot ``sweetspot sweep`` measured before the
run (what a careful operator does), and static at the backend's ``--max-num-seqs`` (what everyone does by
default: no gateway limit at all, the backend's own scheduler is the only one). Neither ever moves, which
is the point: the world shifts under them and they cannot follow.
"""

from __future__ import annotations

from typing import Any

from gateway.control.algorithm import Decision
from gateway.control.baselines.common import decision
from gateway.control.observation import Observation


class StaticLimit:
    """Holds ``limit`` forever."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a static limit is at least 1")
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    def step(self, observation: Observation) -> Decision:
        return decision(observation.now, self._limit, self._limit, "static")

    def state(self) -> dict[str, Any]:
        return {"algorithm": "static", "limit": self._limit}
