"""The concurrency-limit schemes a user could pick today instead of sweetspot's controller, each as a
:class:`gateway.control.algorithm.LimitAlgorithm` the scenario harness runs in the controller's place.

They are test and benchmark tooling, never shipped in the server: ``bench/baselines.py`` runs each on
every scenario against the same oracle, and ``tests/unit/test_baselines.py`` checks each reacts as its
reference says. One algorithm per module, each with its reference and published defaults in its
docstring; none is tuned for LLM serving, since that is the point of the comparison.
"""

from tests.support.baselines.aimd_latency import AimdLatencyLimit
from tests.support.baselines.envoy_gradient import EnvoyGradient
from tests.support.baselines.gradient2 import Gradient2Limit
from tests.support.baselines.static import StaticLimit
from tests.support.baselines.threshold import ThresholdGate
from tests.support.baselines.vegas import VegasLimit

__all__ = ["AimdLatencyLimit", "EnvoyGradient", "Gradient2Limit", "StaticLimit", "ThresholdGate", "VegasLimit"]
