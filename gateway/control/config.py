"""The controller's knobs, declared once: :class:`ControllerKnobs` holds each with its default, its bounds and
the reasoning behind it. :class:`gateway.settings.Settings` inherits them (so each is a flag, a
``SWEETSPOT_*`` variable and a TOML key), and :class:`AimdConfig` is the frozen value the algorithm is built
from; tests and the scenario harness build it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ControllerKnobs(BaseModel):
    """Every knob of the limit algorithm, with the reasoning behind its default."""

    limit_min: int = Field(1, ge=1, description="The controller never sets a limit below this.")
    limit_max: int = Field(256, ge=1, description="The controller never sets a limit above this.")
    window_s: float = Field(
        10.0, gt=0, description="Sliding window of per-request samples the statistics and the controller read."
    )
    ttft_p99_slo_s: float | None = Field(
        2.0,
        gt=0,
        description="p99 time to first token objective, net of the gateway's queue (what the backend causes). "
        "2 s: past it a chat user sees a stalled answer; matches `sweetspot sweep`'s default SLO. Unset: off.",
    )
    tpot_p99_slo_s: float | None = Field(
        0.1,
        gt=0,
        description="p99 time per output token objective. 0.1 s = 10 tokens/s per stream, still faster than "
        "people read, so streaming never stalls the reader; matches `sweetspot sweep`'s default SLO. Unset: off.",
    )
    min_samples: int = Field(
        10,
        ge=1,
        description="Successful requests a window needs before its p99 latencies are judged; the p99 of "
        "fewer is one slow request, not a trend.",
    )
    decrease_factor: float = Field(
        0.8,
        gt=0,
        lt=1,
        description="Multiplicative decrease on headroom or latency breaches. Gentle (TCP CUBIC uses 0.7, "
        "Netflix AIMD 0.9) because the knee is near; latency cuts deeper in proportion to the overshoot.",
    )
    error_decrease_factor: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Multiplicative decrease when the upstream fails (5xx, connection errors, timeouts): halve, "
        "as TCP does on loss, then slow-start back towards the last good limit once it recovers.",
    )
    error_rate_max: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Share of the window's requests failing upstream that counts as congestion. 5%: a lone "
        "error in a busy window is noise; client cancellations and 4xx never count.",
    )
    kv_usage_high: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Backend KV-cache usage that, held for breach_ticks, cuts the limit. vLLM preempts only when "
        "a running request finds no free block (1.0), and a full cache is an efficient one: 0.95 leaves the "
        "running requests room to grow for a few seconds (GIE's 0.8 throws away a fifth of the cache).",
    )
    kv_usage_resume: float = Field(
        0.9,
        gt=0,
        le=1,
        description="KV-cache usage above which the limit is not raised, and that sizes any step up (it takes "
        "at most 3/4 of the room left under it): the hysteresis band below kv_usage_high.",
    )
    gpu_free_memory_floor: float = Field(
        0.03,
        ge=0,
        lt=1,
        description="NVML free/total memory under which the limit is cut (once, and again only if it keeps "
        "falling: vLLM and llama-server preallocate, so lowering the limit rarely gives memory back). 3% is "
        "the last few GB of a large card: the edge of an out-of-memory crash.",
    )
    backend_queue_persist_s: float = Field(
        6.0,
        gt=0,
        description="How long the backend's own queue must stay non-empty before it cuts the limit: queueing "
        "there means we admit more than it runs (three default ticks, so one scrape cannot trigger it).",
    )
    breach_ticks: int = Field(
        2,
        ge=1,
        description="Consecutive ticks a threshold (KV usage, GPU memory, p99 TTFT/TPOT) must be crossed "
        "before it counts; a single crossing only blocks increases.",
    )
    metrics_stale_s: float = Field(
        10.0, gt=0, description="Backend metrics older than this are treated as missing (fall back to local signals)."
    )
    marginal_gain_min: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="While searching upward (slow start, climb), a step is kept going when each added slot "
        "adds at least this share of the average per-slot tokens/s below it. Small on purpose: this only "
        "decides how far to look; where to sit is knee_fraction's job on the measured curve.",
    )
    knee_fraction: float = Field(
        0.97,
        gt=0,
        le=1,
        description="The knee: the smallest limit whose throughput reaches this share of the best measured. "
        "Near the top a curve is flat, so the last few percent of throughput cost much more concurrency "
        "(latency, KV cache) than they are worth (docs/controller.md).",
    )
    knee_margin: float = Field(
        0.1,
        ge=0,
        le=1,
        description="The limit sits this much above the knee: headroom against reading noise, since just below "
        "the knee a lost slot costs throughput and just above it only a little latency (and the best the "
        "controller measures, below the KV cliff, is a little under the true peak).",
    )
    probe_step_scale: float = Field(
        0.5,
        gt=0,
        description="Probe step beside the knee = max(1, round(scale * sqrt(limit))) slots: one slot at limit 64 "
        "moves throughput by less than a reading's noise, and a sublinear step still evens out gateways "
        "sharing a backend (a proportional one would keep any split).",
    )
    settle_s: float = Field(
        2.0,
        ge=0,
        description="After a limit change, time (and draining to the new limit) before throughput counts "
        "as measured at it: new requests need their prefill first.",
    )
    measure_s: float = Field(
        6.0,
        gt=0,
        description="One throughput reading lasts this long: long enough that the stalls of the batch each "
        "admitted prompt's prefill causes average out (docs/controller.md measures what is left); the curve "
        "pools readings, a limit is moved only after three.",
    )
    reprobe_s: float = Field(
        30.0,
        gt=0,
        description="Busy time (time the limit was the bottleneck) at the knee before probing one step beside it "
        "again (alternately up and down), so a backend that got faster is found again; at the hard cap, while "
        "the point below stays clearly worse, the wait doubles up to 8 periods; a limit that caused congestion "
        "is not retried for twice this.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.limit_min > self.limit_max:
            raise ValueError(f"limit_min ({self.limit_min}) exceeds limit_max ({self.limit_max})")
        if self.kv_usage_resume > self.kv_usage_high:
            raise ValueError(f"kv_usage_resume ({self.kv_usage_resume}) exceeds kv_usage_high ({self.kv_usage_high})")
        return self


class AimdConfig(ControllerKnobs):
    """The knobs as one frozen value: what :class:`gateway.control.knee_search.aimd.Aimd` is built from."""

    model_config = ConfigDict(frozen=True)

    def with_(self, **changes: Any) -> AimdConfig:
        """A copy with ``changes`` applied, validated like the original."""
        return AimdConfig.model_validate({**self.model_dump(), **changes})

    @classmethod
    def from_settings(cls, knobs: ControllerKnobs) -> AimdConfig:
        """The controller's knobs out of the gateway's settings (which inherit :class:`ControllerKnobs`)."""
        return cls.model_validate(knobs.model_dump(include=set(ControllerKnobs.model_fields)))


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
