"""The interface between a limit algorithm and whoever runs it (the gateway, the scenario harness).

As in Netflix's ``concurrency-limits``, the *algorithm* (which limit, and why) is separate from the
*limiter* (who holds a permit): an algorithm is a value-in, value-out object, ``step(observation) ->
decision``, with its clock carried by the observation. It never sleeps, never reads a clock, never does
I/O, so tests drive it tick by tick and a decision can always be replayed from its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from gateway.control.observation import Observation
from gateway.control.window import RequestSample


class Action(str, Enum):
    INCREASE = "increase"
    DECREASE = "decrease"
    HOLD = "hold"


class Phase(str, Enum):
    """Where the knee search is. The values are log fields: stable."""

    SLOW_START = "slow_start"  # doubling from the start (or back towards the last good limit after failures)
    CLIMB = "climb"  # a doubling ran into headroom: climbing to the top of the curve in quarter steps
    CRUISE = "cruise"  # at the knee, with a probe beside it every re-probe period


class Reason(str, Enum):
    """Why the limit moved or stayed. The values are Prometheus label values and log fields: stable."""

    # congestion: multiplicative decrease (at most one per window)
    UPSTREAM_ERRORS = "upstream_errors"  # 5xx / connection failures / upstream timeouts
    KV_USAGE = "kv_usage_high"  # the backend's KV cache is nearly full
    PREEMPTIONS = "preemptions"  # the backend's preemption counter rose
    GPU_MEMORY = "gpu_memory_low"  # NVML free memory under its floor
    BACKEND_QUEUE = "backend_queue"  # the backend queued requests itself, persistently
    TTFT = "ttft_slo"  # p99 TTFT (net of our queue) over its objective
    TPOT = "tpot_slo"  # p99 TPOT over its objective (measured, or predicted for a probe)
    # bounds
    HARD_CAP = "hard_cap"  # above what the upstream can run at all (slots, KV capacity)
    AT_MIN = "at_min"
    AT_MAX = "at_max"
    # searching for the knee
    SLOW_START = "slow_start"  # doubling until a doubling stops paying, or congestion
    PROBE = "probe"  # measuring a limit beside the knee (or climbing towards the top of the curve)
    KNEE = "knee"  # moving to the knee read off the measured curve
    RECOVERED = "recovered"  # back to the limit before a slowdown cut: the backend's old speed is back
    # holding
    STEADY = "steady"  # at the knee; the next probe is scheduled
    SETTLING = "settling"  # the last change has not been measured yet
    NO_DEMAND = "no_demand"  # the limit is not the bottleneck, so raising it would prove nothing
    COOLDOWN = "cooldown"  # congested, but already decreased within this window
    CEILING = "ceiling"  # the next step up would retry a limit that recently caused congestion
    HEADROOM_NEAR = "headroom_near"  # a headroom signal is inside its hysteresis band
    FAIR_SHARE = "fair_share"  # yielding a step to other clients of a full backend
    FOLLOW = "follow"  # a replica moving with the replica that searches for all of them, by demand


@dataclass(frozen=True, slots=True)
class Decision:
    """One tick's answer: the limit to apply now, what happened to it and why, and what it saw."""

    now: float
    limit: int
    previous: int
    action: Action
    reason: Reason
    phase: Phase | str | None  # Aimd's phases; other algorithms name their own, or None
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.limit != self.previous

    def as_dict(self) -> dict[str, Any]:
        return {
            "now": round(self.now, 3),
            "limit": self.limit,
            "previous": self.previous,
            "action": self.action.value,
            "reason": self.reason.value,
            "phase": self.phase.value if isinstance(self.phase, Phase) else self.phase,
            "inputs": self.inputs,
        }


class LimitAlgorithm(Protocol):
    """A concurrency-limit algorithm: one ``step`` per control tick."""

    @property
    def limit(self) -> int: ...

    def step(self, observation: Observation) -> Decision: ...

    def state(self) -> dict[str, Any]:
        """JSON-able internal state, for the controller's state view."""
        ...


@runtime_checkable
class RequestObserver(Protocol):
    """An algorithm that also learns from each request as it ends, as Netflix's ``Limit.onSample`` and
    Envoy's gradient controller do (the comparison baselines in ``gateway/control/baselines``). Whoever
    runs it calls ``on_request`` when a request ends and applies the limit it returns at once.
    ``inflight_at_start`` is the in-flight count just after this request was admitted (itself
    included), which is what Netflix's limiters hand their algorithm; ``inflight`` is the count now."""

    def on_request(self, now: float, sample: RequestSample, inflight_at_start: int, inflight: int) -> int: ...
