"""The concurrency-limit schemes a user could pick today instead of sweetspot's controller, each a
:class:`gateway.control.algorithm.LimitAlgorithm`.

They ship as the ``algorithm`` setting's built-in names (``sweetspot serve --algorithm netflix-vegas``), as
Netflix's concurrency-limits ships its alternatives beside its default, and they are the comparison's
contenders: ``bench/baselines.py`` runs each on every scenario against the same oracle, in the scenario
harness, and ``tests/unit/test_baselines.py`` checks each reacts as its reference says. One algorithm per
module, each with its reference and published defaults in its docstring; none is tuned for LLM serving,
since that is the point of the comparison.
"""

from collections.abc import Callable, Mapping

from gateway.control.algorithm import LimitAlgorithm
from gateway.control.baselines.aimd_latency import AimdLatencyLimit
from gateway.control.baselines.envoy_gradient import EnvoyGradient
from gateway.control.baselines.gradient2 import Gradient2Limit
from gateway.control.baselines.static import StaticLimit
from gateway.control.baselines.threshold import ThresholdGate
from gateway.control.baselines.vegas import VegasLimit

#: A built-in's factory: one fresh algorithm for one upstream, given the limit the gateway would hold that
#: upstream at without one (its sweep result's sweet spot, else ``initial_limit``; within ``limit_min`` and
#: ``limit_max``). Only ``static`` takes it, to hold it; every other one starts where its reference's
#: published defaults say (its module's docstring).
BuiltIn = Callable[[int], LimitAlgorithm]

#: The ``algorithm`` setting's short names. Each reference's pace is its own: the gateway ticks every algorithm
#: every ``control_interval_s``, so ``envoy-gradient`` runs as Envoy does at 0.1 s and ``gie-threshold`` as GIE
#: does with ``control_interval_s`` and ``metrics_interval_s`` at 0.05 s (it counts a reading older than 0.2 s as
#: saturated). Another configuration of one of them is an import path to a factory of your own.
BUILT_IN: Mapping[str, BuiltIn] = {
    "static": StaticLimit,
    "gie-threshold": lambda _limit: ThresholdGate(),
    "envoy-gradient": lambda _limit: EnvoyGradient(),
    "netflix-gradient2": lambda _limit: Gradient2Limit(),
    "netflix-vegas": lambda _limit: VegasLimit(),
    "netflix-aimd": lambda _limit: AimdLatencyLimit(),
}

__all__ = [
    "BUILT_IN",
    "AimdLatencyLimit",
    "BuiltIn",
    "EnvoyGradient",
    "Gradient2Limit",
    "StaticLimit",
    "ThresholdGate",
    "VegasLimit",
]
