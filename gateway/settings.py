"""Every knob of the gateway, in one pydantic-settings class.

Precedence, highest first: command-line flags (passed as keyword arguments), ``SWEETSPOT_*``
environment variables, a TOML file (``--config`` / ``SWEETSPOT_CONFIG``), then the defaults below.
Nothing else in the code base reads the environment: a reader looking for a knob finds it here.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

_TOML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("sweetspot_toml", default=None)

BackendKind = Literal["auto", "vllm", "llamacpp", "openai"]


def _split_csv(value: Any) -> Any:
    """Accept ``a,b`` as well as JSON lists from the environment, and lists from TOML/flags."""
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            import json

            return json.loads(value)
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """The gateway's configuration. Field docs are the reference; ``sweetspot serve --help`` mirrors them."""

    model_config = SettingsConfigDict(env_prefix="SWEETSPOT_", extra="ignore", validate_default=True)

    # --- listening -------------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0 in containers).")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on.")
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    # --- upstreams -------------------------------------------------------------------------------
    upstreams: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Base URLs of the inference servers, e.g. http://vllm:8000."
    )
    backend: BackendKind = Field(
        "auto", description="Backend type for reading its /metrics; 'auto' detects it from what the server answers."
    )
    upstream_api_key: str | None = Field(
        None, description="Bearer token the gateway sends upstream instead of the client's."
    )
    connect_timeout_s: float = Field(5.0, gt=0, description="TCP connect timeout to an upstream.")
    upstream_timeout_s: float = Field(
        600.0, gt=0, description="Longest a single upstream request may take (generation included)."
    )
    health_interval_s: float = Field(2.0, gt=0, description="How often each upstream's health is polled.")
    metrics_interval_s: float = Field(
        2.0, gt=0, description="How often each upstream's own /metrics (KV usage, waiting, preemptions) is scraped."
    )
    metrics_stale_s: float = Field(
        10.0, gt=0, description="Backend metrics older than this are treated as missing (fall back to local signals)."
    )

    # --- clients ---------------------------------------------------------------------------------
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Accepted client API keys (Authorization: Bearer). Empty: no auth."
    )
    max_body_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="Largest request body accepted; larger gets 413."
    )
    priority_header: str = Field(
        "x-sweetspot-priority",
        description="Request header carrying an integer priority; higher is admitted first, FIFO within a priority.",
    )

    # --- admission -------------------------------------------------------------------------------
    max_queue: int = Field(
        1024, ge=0, description="Requests allowed to wait for a permit; beyond it the gateway answers 429."
    )
    queue_timeout_s: float = Field(
        60.0, gt=0, description="Longest a request may wait in the queue before a 503 with Retry-After."
    )
    initial_limit: int = Field(
        8, ge=1, description="Concurrency limit per upstream at start (or always, with the controller off)."
    )
    limit_min: int = Field(1, ge=1, description="The controller never sets a limit below this.")
    limit_max: int = Field(256, ge=1, description="The controller never sets a limit above this.")
    window_s: float = Field(
        10.0, gt=0, description="Sliding window of per-request samples the statistics and the controller read."
    )
    sweep_result: Path | None = Field(
        None, description="A `sweetspot sweep` JSON result: the controller starts at its sweet spot."
    )
    kv_capacity_tokens: int | None = Field(
        None, ge=1,
        description="KV-cache capacity of each upstream in tokens (e.g. from `sweetspot plan --json`), used as a "
        "hard cap (capacity / typical request size) when the backend's own metrics give none.",
    )

    # --- controller (AIMD) -----------------------------------------------------------------------
    control_enabled: bool = Field(True, description="Move the limit with the AIMD controller; off = static limit.")
    control_interval_s: float = Field(2.0, gt=0, description="Controller tick period.")
    ttft_p99_slo_s: float | None = Field(
        2.0, gt=0,
        description="p99 time to first token objective, net of the gateway's queue (what the backend causes). "
        "2 s: past it a chat user sees a stalled answer; matches `sweetspot sweep`'s default SLO. Unset: off.",
    )
    tpot_p99_slo_s: float | None = Field(
        0.1, gt=0,
        description="p99 time per output token objective. 0.1 s = 10 tokens/s per stream, still faster than "
        "people read, so streaming never stalls the reader; matches `sweetspot sweep`'s default SLO. Unset: off.",
    )
    decrease_factor: float = Field(
        0.8, gt=0, lt=1,
        description="Multiplicative decrease on headroom or latency breaches. Gentle (TCP CUBIC uses 0.7, "
        "Netflix AIMD 0.9) because the knee is near; latency cuts deeper in proportion to the overshoot.",
    )
    error_decrease_factor: float = Field(
        0.5, gt=0, lt=1,
        description="Multiplicative decrease when the upstream fails (5xx, connection errors, timeouts): halve, "
        "as TCP does on loss, then slow-start back towards the last good limit once it recovers.",
    )
    error_rate_max: float = Field(
        0.05, ge=0, le=1,
        description="Share of the window's requests failing upstream that counts as congestion. 5%: a lone "
        "error in a busy window is noise; client cancellations and 4xx never count.",
    )
    kv_usage_high: float = Field(
        0.95, gt=0, le=1,
        description="Backend KV-cache usage that, held for breach_ticks, cuts the limit. vLLM preempts only when "
        "a running request finds no free block (1.0), and a full cache is an efficient one: 0.95 leaves the "
        "running requests room to grow for a few seconds (GIE's 0.8 throws away a fifth of the cache).",
    )
    kv_usage_resume: float = Field(
        0.9, gt=0, le=1,
        description="KV-cache usage above which the limit is not raised, and that sizes any step up (it takes "
        "at most 3/4 of the room left under it): the hysteresis band below kv_usage_high.",
    )
    gpu_free_memory_floor: float = Field(
        0.03, ge=0, lt=1,
        description="NVML free/total memory under which the limit is cut (once, and again only if it keeps "
        "falling: vLLM and llama-server preallocate, so lowering the limit rarely gives memory back). 3% is "
        "the last few GB of a large card: the edge of an out-of-memory crash.",
    )
    backend_queue_persist_s: float = Field(
        6.0, gt=0,
        description="How long the backend's own queue must stay non-empty before it cuts the limit: queueing "
        "there means we admit more than it runs (three default ticks, so one scrape cannot trigger it).",
    )
    breach_ticks: int = Field(
        2, ge=1,
        description="Consecutive ticks a threshold (KV usage, GPU memory, p99 TTFT/TPOT) must be crossed "
        "before it counts; a single crossing only blocks increases.",
    )
    min_samples: int = Field(
        10, ge=1,
        description="Successful requests a window needs before its p99 latencies are judged; the p99 of "
        "fewer is one slow request, not a trend.",
    )
    marginal_gain_min: float = Field(
        0.1, ge=0, lt=1,
        description="While searching upward (slow start, climb), a step is kept going when each added slot "
        "adds at least this share of the average per-slot tokens/s below it. Small on purpose: this only "
        "decides how far to look; where to sit is knee_fraction's job on the measured curve.",
    )
    knee_fraction: float = Field(
        0.97, gt=0, le=1,
        description="The knee: the smallest limit whose throughput reaches this share of the best measured. "
        "The last 3% of throughput costs roughly a third more concurrency (latency, KV) on a typical curve.",
    )
    knee_margin: float = Field(
        0.1, ge=0, le=1,
        description="The limit sits this much above the knee: headroom against reading noise, since just below "
        "the knee a lost slot costs throughput and just above it only a little latency (and the best the "
        "controller measures, below the KV cliff, is a little under the true peak).",
    )
    probe_step_scale: float = Field(
        0.5, gt=0,
        description="Probe step beside the knee = max(1, round(scale * sqrt(limit))) slots: one slot at limit 64 "
        "moves throughput by less than a reading's noise, and a sublinear step still evens out gateways "
        "sharing a backend (a proportional one would keep any split).",
    )
    settle_s: float = Field(
        2.0, ge=0,
        description="After a limit change, time (and draining to the new limit) before throughput counts "
        "as measured at it: new requests need their prefill first.",
    )
    measure_s: float = Field(
        6.0, gt=0,
        description="One throughput reading lasts this long. 6 s of a busy LLM backend vary by ~2-3% (each "
        "admitted prompt stalls the batch); the curve pools readings, a limit is moved only after three.",
    )
    reprobe_s: float = Field(
        30.0, gt=0,
        description="Busy time (time the limit was the bottleneck) at the knee before probing one step beside it "
        "again (alternately up and down), so a backend that got faster is found again; at the hard cap, while "
        "the point below stays clearly worse, the wait doubles up to 8 periods; a limit that caused congestion "
        "is not retried for twice this.",
    )
    gpus: Annotated[list[int], NoDecode] = Field(
        default_factory=list,
        description="NVML indices of the GPUs whose headroom counts, e.g. 0,1. Empty: every GPU NVML sees.",
    )
    nvml_interval_s: float = Field(5.0, gt=0, description="How often GPU headroom is read from NVML.")

    @field_validator("upstreams", "api_keys", "gpus", mode="before")
    @classmethod
    def _csv(cls, value: Any) -> Any:
        return _split_csv(value)

    @field_validator("upstreams")
    @classmethod
    def _strip_slash(cls, value: list[str]) -> list[str]:
        return [url.rstrip("/") for url in value]

    @model_validator(mode="after")
    def _bounds(self) -> "Settings":
        if self.limit_min > self.limit_max:
            raise ValueError(f"limit_min ({self.limit_min}) exceeds limit_max ({self.limit_max})")
        if self.kv_usage_resume > self.kv_usage_high:
            raise ValueError(f"kv_usage_resume ({self.kv_usage_resume}) exceeds kv_usage_high ({self.kv_usage_high})")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = _TOML_FILE.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


def load_settings(config: Path | None = None, **flags: Any) -> Settings:
    """Build the settings from flags (``None`` values mean "not given"), env and an optional TOML file."""
    import os

    if config is None and os.environ.get("SWEETSPOT_CONFIG"):
        config = Path(os.environ["SWEETSPOT_CONFIG"])
    if config is not None and not config.is_file():
        raise FileNotFoundError(f"config file not found: {config}")
    token = _TOML_FILE.set(config)
    try:
        return Settings(**{key: value for key, value in flags.items() if value is not None})
    finally:
        _TOML_FILE.reset(token)
