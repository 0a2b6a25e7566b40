"""The built-in simulator of a continuous-batching inference server (vLLM-like).

Pure parts, importable anywhere without I/O: :class:`Engine` (the scheduler and step-time model
on an injected clock), the calibrated :mod:`profiles <gateway.sim.profiles>`, and the oracle
:func:`predict_closed_loop`. The HTTP server (``gateway.sim.http_app``, run by ``sweetspot sim``)
is built on them. Nothing here imports the gateway, and the gateway never imports this.
"""

from gateway.sim.engine import Engine, InjectedError, Scenario, Sequence, StepResult
from gateway.sim.oracle import ClosedLoopPrediction, predict_closed_loop, sweep_closed_loop
from gateway.sim.profiles import DEFAULT_PROFILE, PROFILES, Profile, get_profile

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "ClosedLoopPrediction",
    "Engine",
    "InjectedError",
    "Profile",
    "Scenario",
    "Sequence",
    "StepResult",
    "get_profile",
    "predict_closed_loop",
    "sweep_closed_loop",
]
