"""The sweep's result: a versioned, validated JSON document, and the one loader every consumer uses.

``sweetspot serve --sweep-result FILE`` reads the measured sweet spot and peak from here, possibly
months after the sweep ran, so the shape is a pydantic model with a ``kind`` and a ``schema_version``:
a file from an incompatible version, or a hand-edited one that lost a field, fails loudly at load time
instead of starting a controller at a wrong limit. Latencies are milliseconds (as ``vllm bench serve``
writes them); throughputs are per second of the level's measurement window.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

KIND: Literal["sweetspot.sweep"] = "sweetspot.sweep"
SCHEMA_VERSION: Literal[1] = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Stats(_Model):
    """Mean and percentiles of one latency over a level's measured requests (None when no samples)."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class SLO(_Model):
    """Latency objectives in ms; None disables one. Per request they decide goodput (as in vLLM);
    at p99 over a level they decide whether the level may be the sweet spot."""

    ttft_ms: float | None = Field(2000.0, gt=0)
    tpot_ms: float | None = Field(100.0, gt=0)
    e2e_ms: float | None = Field(None, gt=0)

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))


TokenCounting = Literal["usage", "chunks", "mixed", "none"]


class LevelMetrics(_Model):
    """Everything measured at one concurrency level."""

    concurrency: int = Field(ge=1)
    rate: float | None = None  # open-loop arrival rate (req/s); None for closed loop
    duration_s: float = Field(0.0, ge=0)  # the measurement window, warm-up and drain excluded
    requests: int = 0  # requests started inside the window (the measured ones)
    completed: int = 0  # ... of which succeeded
    failed: int = 0  # ... of which failed (server or network errors)
    rejected: int = 0  # ... of which got a 429/503 overload answer (a gateway's queue)
    status_counts: dict[str, int] = Field(default_factory=dict)
    error_samples: list[str] = Field(default_factory=list)
    error_rate: float = 0.0  # failed / requests
    output_tokens: int = 0
    input_tokens: int = 0
    output_tokens_per_s: float = 0.0
    requests_per_s: float = 0.0
    goodput_requests_per_s: float | None = None
    ttft_ms: Stats = Field(default_factory=Stats)
    tpot_ms: Stats = Field(default_factory=Stats)
    itl_ms: Stats = Field(default_factory=Stats)
    e2e_ms: Stats = Field(default_factory=Stats)
    token_counting: TokenCounting = "usage"
    slo_met: bool = True
    slo_violations: list[str] = Field(default_factory=list)
    timed_out: bool = False  # the level hit its time limit before measuring all it wanted


class SweetSpot(_Model):
    concurrency: int
    output_tokens_per_s: float
    fraction_of_peak: float
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None


class Cliff(_Model):
    concurrency: int
    kind: Literal["throughput_drop", "errors"]
    reason: str
    output_tokens_per_s: float
    best_before_concurrency: int | None = None
    best_before_tokens_per_s: float | None = None


class Verdict(_Model):
    """What the finder concluded from the levels."""

    peak_tokens_per_s: float
    peak_concurrency: int | None
    sweet_spot: SweetSpot | None
    cliff: Cliff | None
    reason: str


class ServerInfo(_Model):
    url: str
    api: Literal["chat", "completions", "responses", "messages"]
    model: str
    models: list[str] = Field(default_factory=list)


class SweepSettings(_Model):
    levels: list[int]
    mode: Literal["closed", "poisson"] = "closed"
    rate: float | None = None
    requests_per_level: int | None = None  # None: auto (4 per client, at least 16)
    duration_s: float | None = None  # seconds per level, instead of a request count
    warmup_requests: int | None = None  # None: one per client
    warmup_s: float | None = None
    level_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    workload: dict[str, object] = Field(default_factory=dict)
    slo: SLO = Field(default_factory=SLO)
    fraction: float = Field(0.9, gt=0, le=1)
    cliff_tolerance: float = Field(0.10, ge=0, lt=1)
    max_error_rate: float = Field(0.01, ge=0, le=1)
    early_stop: bool = True


class SweepResult(_Model):
    kind: Literal["sweetspot.sweep"] = KIND
    schema_version: Literal[1] = SCHEMA_VERSION
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    sweetspot_version: str = ""
    server: ServerInfo
    settings: SweepSettings
    levels: list[LevelMetrics]
    peak_tokens_per_s: float
    peak_concurrency: int | None
    sweet_spot: SweetSpot | None
    cliff: Cliff | None
    verdict: str
    stopped_early: bool = False
    token_counting: TokenCounting = "usage"
    elapsed_s: float = 0.0
    notes: list[str] = Field(default_factory=list)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


class SweepResultError(ValueError):
    """A sweep result file that is missing, unreadable, or not of a schema this version understands."""


def save_sweep_result(result: SweepResult, path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(result.to_json() + "\n", encoding="utf-8")
    return target


def load_sweep_result(path: str | Path) -> SweepResult:
    """Read and validate a sweep result; ``.sweet_spot`` and ``.peak_tokens_per_s`` are the answer.

    Raises :class:`SweepResultError` with a readable reason for anything it cannot trust.
    """
    source = Path(path)
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SweepResultError(f"cannot read sweep result {source}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise SweepResultError(f"{source} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise SweepResultError(f"{source} is not a sweetspot sweep result (expected kind {KIND!r})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise SweepResultError(
            f"{source} has schema_version {data.get('schema_version')!r}; this sweetspot reads version "
            f"{SCHEMA_VERSION} (run the sweep again with this version)"
        )
    try:
        return SweepResult.model_validate(data)
    except ValidationError as exc:
        raise SweepResultError(f"{source} does not match the sweep result schema: {exc}") from exc
