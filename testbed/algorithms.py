"""Limit algorithms that exist only to test the gateway's ``algorithm`` seam
(``gateway/server/feedback/algorithm_path.py``): each does one thing a test can see from outside the gateway,
through its state view."""

from __future__ import annotations

from typing import Any

from gateway.control.algorithm import Action, Decision, Reason
from gateway.control.observation import Observation
from gateway.control.window import Outcome, RequestSample


class Wild:
    """Starts at 1000 and asks for 0 at every tick: both outside any sane bounds, which the gateway must apply."""

    def __init__(self) -> None:
        self._limit = 1000

    @property
    def limit(self) -> int:
        return self._limit

    def step(self, observation: Observation) -> Decision:
        previous, self._limit = self._limit, 0
        return Decision(observation.now, 0, previous, Action.DECREASE, Reason.AT_MIN, "wild")

    def state(self) -> dict[str, Any]:
        return {"algorithm": "wild", "limit": self._limit}


class Counting:
    """A limit of 3 that counts what the gateway hands it: ticks, and requests as they end (with the in-flight
    counts it was given), so a test can compare them with what its clients did."""

    def __init__(self) -> None:
        self.ticks = 0
        self.ended = 0
        self.ok = 0
        self.tokens = 0
        self.max_inflight_at_start = 0
        self.max_inflight_after = 0
        self.outcomes: dict[str, int] = {}

    @property
    def limit(self) -> int:
        return 3

    def step(self, observation: Observation) -> Decision:
        self.ticks += 1
        return Decision(observation.now, 3, 3, Action.HOLD, Reason.STEADY, "counting")

    def on_request(self, now: float, sample: RequestSample, inflight_at_start: int, inflight: int) -> int:
        self.ended += 1
        self.ok += sample.outcome is Outcome.OK
        self.outcomes[sample.outcome.value] = self.outcomes.get(sample.outcome.value, 0) + 1
        self.tokens += sample.output_tokens
        self.max_inflight_at_start = max(self.max_inflight_at_start, inflight_at_start)
        self.max_inflight_after = max(self.max_inflight_after, inflight)
        return 3

    def state(self) -> dict[str, Any]:
        return {
            "algorithm": "counting",
            "ticks": self.ticks,
            "ended": self.ended,
            "ok": self.ok,
            "tokens": self.tokens,
            "max_inflight_at_start": self.max_inflight_at_start,
            "max_inflight_after": self.max_inflight_after,
            "outcomes": self.outcomes,
        }
