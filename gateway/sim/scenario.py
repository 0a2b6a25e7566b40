"""The run-time knobs of a simulated backend ("the backend got 2x slower"), and the error they inject.

A scenario is a fault or change the tests and benchmarks apply to a running engine, apart from
its calibrated :class:`~gateway.sim.profiles.Profile` (what the hardware and model *are*). The engine
validates and applies the knobs in :meth:`Engine.set_scenario <gateway.sim.engine.Engine.set_scenario>`.
"""

from __future__ import annotations

from dataclasses import dataclass


class InjectedError(RuntimeError):
    """Raised by :meth:`Engine.submit` when the scenario's error rate says this request fails."""


@dataclass(slots=True)
class Scenario:
    """Run-time knobs ("the backend got 2x slower"), changed through :meth:`Engine.set_scenario`."""

    speed_factor: float = 1.0  # step durations are multiplied by this (2.0 = twice as slow)
    kv_fraction: float = 1.0  # share of the profile's KV blocks available
    max_num_seqs: int | None = None  # overrides the profile's cap
    error_rate: float = 0.0  # probability that submit() raises InjectedError
    error_status: int = 500  # the HTTP status of an injected failure (503: vLLM asleep or overloaded)
    stalled_until: float = float("-inf")  # no step starts before this engine time
