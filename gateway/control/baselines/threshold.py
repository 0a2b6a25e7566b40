"""Threshold admission in the style of the Kubernetes Gateway API Inference Extension (GIE).

Reference: kubernetes-sigs/gateway-api-inference-extension, the flow controller's saturation detector,
``pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization/{config.go,detector.go}``, and the
EPP's options (``DefaultRefreshMetricsInterval``). Published defaults:

- ``DefaultQueueDepthThreshold`` = 5 (the backend's waiting requests);
- ``DefaultKVCacheUtilThreshold`` = 0.8;
- ``DefaultMetricsStalenessThreshold`` = 200 ms (older metrics count as saturated);
- ``DefaultRefreshMetricsInterval`` = 50 ms (how often each model server's ``/metrics`` is read).

A pod's saturation is ``max(waiting / 5, kv_usage / 0.8)`` (1.0 when its metrics are missing or stale),
and the flow controller dispatches queued requests only while the pool's saturation is under 1.0, i.e.
while waiting < 5 and KV usage < 0.8 on the last reading. It holds no concurrency number of its own:
while the gate is open everything queued goes through at once, and while it is shut nothing does.

As a :class:`LimitAlgorithm` that is a limit equal to "everyone waiting" when open and "nobody new" when
shut, re-read at every scrape. The harness must tick it at the scrape rate (50 ms), and requests that end
while the gate is shut must not free a slot (``on_request``).
"""

from __future__ import annotations

from typing import Any

from gateway.control.algorithm import Decision, Reason
from gateway.control.baselines.common import decision
from gateway.control.observation import Observation
from gateway.control.window import RequestSample

QUEUE_DEPTH_THRESHOLD = 5
KV_CACHE_UTIL_THRESHOLD = 0.8
METRICS_STALENESS_S = 0.2
REFRESH_METRICS_INTERVAL_S = 0.05


class ThresholdGate:
    """GIE's saturation gate: open while the last fresh reading shows waiting < 5 and KV usage < 0.8."""

    def __init__(
        self,
        *,
        queue_depth_threshold: int = QUEUE_DEPTH_THRESHOLD,
        kv_cache_util_threshold: float = KV_CACHE_UTIL_THRESHOLD,
        staleness_s: float = METRICS_STALENESS_S,
        initial_limit: int = 0,
    ) -> None:
        self.queue_depth_threshold = queue_depth_threshold
        self.kv_cache_util_threshold = kv_cache_util_threshold
        self.staleness_s = staleness_s
        self._limit = max(initial_limit, 0)
        self.open = False
        self.saturation: float = 1.0

    @property
    def limit(self) -> int:
        return self._limit

    def saturation_of(self, observation: Observation) -> float:
        """The detector's score for one pod: 1.0 when a reading is missing or stale."""
        kv, waiting = observation.kv_usage, observation.backend_waiting
        kv_age, waiting_age = observation.kv_usage_age_s, observation.backend_waiting_age_s
        if kv is None or waiting is None or kv_age is None or waiting_age is None:
            return 1.0
        if max(kv_age, waiting_age) > self.staleness_s:
            return 1.0
        return max(waiting / self.queue_depth_threshold, kv / self.kv_cache_util_threshold)

    def step(self, observation: Observation) -> Decision:
        previous = self._limit
        self.saturation = self.saturation_of(observation)
        self.open = self.saturation < 1.0
        if self.open:
            self._limit = max(observation.inflight + observation.queue_depth, 1)
            why = "gate_open"
        else:
            self._limit = observation.inflight
            why = "gate_closed"
        cut = Reason.KV_USAGE if (observation.kv_usage or 0.0) >= self.kv_cache_util_threshold else Reason.BACKEND_QUEUE
        return decision(observation.now, self._limit, previous, why, cut=cut)

    def on_request(self, now: float, sample: RequestSample, inflight_at_start: int, inflight: int) -> int:
        """A shut gate admits nobody, so an ending request takes its slot with it; an open one lets the
        next arrival through (its client's next request, in a closed loop)."""
        if not self.open:
            self._limit = inflight
        return self._limit

    def state(self) -> dict[str, Any]:
        return {"algorithm": "threshold", "limit": self._limit, "open": self.open, "saturation": self.saturation}
