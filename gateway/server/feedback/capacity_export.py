"""The capacity signal's figures as Prometheus series: each known figure set, and the series of a figure no
longer known (an upstream gone, a model no longer served) removed rather than left at its last value."""

from __future__ import annotations

from prometheus_client import Gauge

from gateway.control.capacity_signal import ModelSignal
from gateway.server.upstream.pool import OTHER_MODELS, Upstream
from gateway.telemetry.metrics import GatewayMetrics

#: The capacity signal's gauges (attributes of GatewayMetrics), whose series CapacitySeries keeps in step.
CAPACITY_GAUGES = (
    "upstream_capacity_requests",
    "upstream_capacity_tokens",
    "pool_capacity_requests",
    "pool_capacity_tokens",
    "demand_requests",
    "upstreams_desired",
    "upstreams_serving",
)


def serving_model(upstream: Upstream) -> str:
    """The model an upstream counts under in the capacity signal: the first id it lists (vLLM lists its served
    model first, LoRA adapters after it, all on the same capacity), else ``other`` while its list is unknown."""
    for entry in upstream.models or ():
        if isinstance(entry.get("id"), str):
            return str(entry["id"])
    return OTHER_MODELS


class CapacitySeries:
    """The capacity gauges' series this gateway has set, by gauge, so the next export removes what it drops."""

    def __init__(self) -> None:
        self._series: dict[str, set[tuple[str, ...]]] = {}

    def export(self, metrics: GatewayMetrics, signals: list[ModelSignal]) -> None:
        """Set each known figure; remove the series of what is not known (or no longer exists)."""
        values: dict[str, dict[tuple[str, ...], float]] = {}

        def put(gauge: str, labels: tuple[str, ...], value: float | None) -> None:
            if value is not None:
                values.setdefault(gauge, {})[labels] = value

        for signal in signals:
            model = (signal.model,)
            for upstream, capacity in signal.capacities.items():
                put("upstream_capacity_requests", (upstream, signal.model), capacity.requests_per_s)
                put("upstream_capacity_tokens", (upstream, signal.model), capacity.tokens_per_s)
            put("pool_capacity_requests", model, signal.pool_requests_per_s)
            put("pool_capacity_tokens", model, signal.pool_tokens_per_s)
            put("demand_requests", model, signal.demand_requests_per_s)
            put("upstreams_desired", model, signal.desired)
            put("upstreams_serving", model, signal.upstreams)
        for gauge_name in CAPACITY_GAUGES:
            gauge: Gauge = getattr(metrics, gauge_name)
            now_set = values.get(gauge_name, {})
            for labels in self._series.get(gauge_name, set()) - set(now_set):
                gauge.remove(*labels)
            for labels, value in now_set.items():
                gauge.labels(*labels).set(value)
            self._series[gauge_name] = set(now_set)

    def forget(self, upstream: str) -> None:
        """An upstream left: its series go with its other labelled series (``GatewayMetrics.forget_upstream``)."""
        for series in self._series.values():
            series -= {labels for labels in series if upstream in labels}
