"""The controller's constants, as one frozen value the algorithm is built from.

The gateway builds it from :class:`gateway.settings.Settings` (where each knob is documented with the
reasoning behind its default); tests and the scenario harness build it directly. Defaults here match the
settings' defaults so both paths agree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class AimdConfig:
    limit_min: int = 1
    limit_max: int = 256
    window_s: float = 10.0  # one congestion decrease per window: the evidence must refresh first
    # latency objectives (None disables one)
    ttft_p99_slo_s: float | None = 2.0
    tpot_p99_slo_s: float | None = 0.1
    min_samples: int = 10  # a p99 of fewer successful requests is one slow request, not a trend
    # multiplicative decrease
    decrease_factor: float = 0.8
    error_decrease_factor: float = 0.5
    error_rate_max: float = 0.05
    # headroom
    kv_usage_high: float = 0.95
    kv_usage_resume: float = 0.9
    gpu_free_memory_floor: float = 0.03
    backend_queue_persist_s: float = 6.0
    breach_ticks: int = 2  # consecutive ticks a threshold must be crossed before it counts
    metrics_stale_s: float = 10.0
    # the knee search
    marginal_gain_min: float = 0.1
    knee_fraction: float = 0.97
    knee_margin: float = 0.1
    probe_step_scale: float = 0.5
    settle_s: float = 2.0
    measure_s: float = 6.0
    reprobe_s: float = 30.0

    def __post_init__(self) -> None:
        if not 1 <= self.limit_min <= self.limit_max:
            raise ValueError(f"need 1 <= limit_min ({self.limit_min}) <= limit_max ({self.limit_max})")
        for name in ("decrease_factor", "error_decrease_factor"):
            value = getattr(self, name)
            if not 0 < value < 1:
                raise ValueError(f"{name} must be in (0, 1), got {value}")
        if not 0 < self.kv_usage_resume <= self.kv_usage_high <= 1:
            raise ValueError("need 0 < kv_usage_resume <= kv_usage_high <= 1")
        if not 0 < self.knee_fraction <= 1:
            raise ValueError(f"knee_fraction must be in (0, 1], got {self.knee_fraction}")
        if self.breach_ticks < 1 or self.min_samples < 1:
            raise ValueError("breach_ticks and min_samples must be >= 1")

    def with_(self, **changes: Any) -> "AimdConfig":
        return replace(self, **changes)

    @classmethod
    def from_settings(cls, settings: Any) -> "AimdConfig":
        """Take every field of the same name from a settings object (``gateway.settings.Settings``)."""
        values = {f.name: getattr(settings, f.name) for f in fields(cls) if hasattr(settings, f.name)}
        return cls(**values)


@dataclass(frozen=True, slots=True)
class StartPoint:
    """Where to start: a sweep's measured sweet spot, the peak throughput it measured, and the
    throughput it measured at each level (concurrency, output tokens/s), up to its peak.

    The levels are a measurement of the curve the controller would otherwise have to measure again:
    they bracket the knee from the start, so the controller holds the sweep's answer instead of
    stepping down to find out whether the knee lies lower. They are a prior, not a truth: local
    readings pool into them and replace them within a few readings, and readings far off (another
    backend, another mix) rescale them as any change of the world does."""

    limit: int
    peak_tokens_per_s: float | None = None
    levels: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_sweep(cls, result: Any) -> "StartPoint | None":
        """From a :class:`gateway.bench.result.SweepResult` (None when the sweep found no sweet spot).
        Levels past the peak (a cliff) or with failed requests are left out: the curve the controller
        keeps is the part below the cliff, where throughput never falls as concurrency rises."""
        spot = getattr(result, "sweet_spot", None)
        if spot is None:
            return None
        top = getattr(result, "peak_concurrency", None)
        levels = tuple(sorted(
            (int(level.concurrency), float(level.output_tokens_per_s))
            for level in getattr(result, "levels", ())
            if level.output_tokens_per_s > 0 and not level.failed and (top is None or level.concurrency <= top)
        ))
        return cls(limit=int(spot.concurrency), peak_tokens_per_s=float(result.peak_tokens_per_s), levels=levels)
