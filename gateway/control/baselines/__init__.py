"""The concurrency-limit schemes a user could pick today instead of sweetspot's controller, each as a
:class:`gateway.control.algorithm.LimitAlgorithm` the scenario harness runs in the controller's place.

They are test and benchmark tooling, never shipped in the server: ``bench/baselines.py`` runs each on
every scenario against the same oracle, and ``tests/unit/test_baselines.py`` checks each reacts as its
reference says. One algorithm per module, each with its reference and published defaults in its
docstring; none is tuned for LLM serving, since that is the point of the comparison.
"""

from gateway.control.baselines.aimd_latency import AimdLatencyLimit
from gateway.control.baselines.envoy_gradient import EnvoyGradient
from gateway.control.baselines.gradient2 import Gradient2Limit
from gateway.control.baselines.static import StaticLimit
from gateway.control.baselines.threshold import ThresholdGate
from gateway.control.baselines.vegas import VegasLimit

__all__ = ["AimdLatencyLimit", "EnvoyGradient", "Gradient2Limit", "StaticLimit", "ThresholdGate", "VegasLimit"]
