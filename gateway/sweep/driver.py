"""The concurrency sweep: run level after level, measure each, and hand the levels to the finder.

Each level is one load generator at concurrency N: a warm-up (excluded), a measurement window (a
request count or a number of seconds), then a drain that lets the window's requests finish so their
latencies are known. After each level the cliff detector runs; past a cliff the sweep stops early.

Callers get a :class:`SweepResult` back from :func:`run_sweep` (async) or :func:`run_sweep_sync`, and
may pass ``progress``, a callable that receives a :class:`SweepEvent` at every step (level start,
each finished request, each half second, level end, early stop); the CLI's progress bar is just one
such callable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import gateway
from gateway.sweep.client import RequestRecord, StreamClient, Target
from gateway.sweep.finder import detect_cliff, find_sweet_spot, judge
from gateway.sweep.loadgen import ClosedLoopPool, PoissonLoad
from gateway.sweep.result import SLO, LevelMetrics, ServerInfo, SweepResult, SweepSettings, TokenCounting
from gateway.sweep.stats import level_metrics
from gateway.sweep.workload import ApiKind, RequestFactory, Workload

DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
TICK_S = 0.5

EventKind = Literal["start", "level_start", "progress", "level_end", "stop", "done"]
Phase = Literal["warmup", "measure", "drain", ""]


class SweepError(RuntimeError):
    """The sweep cannot run at all (server unreachable, no model, the test request failed)."""


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """Everything a sweep needs. Defaults are those of ``sweetspot sweep``."""

    url: str
    api: ApiKind = "chat"
    model: str | None = None  # None: the first model of GET /v1/models
    api_key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    levels: Sequence[int] = DEFAULT_LEVELS
    requests_per_level: int | None = None  # None: 4 per client, at least 16 (ignored with duration_s)
    duration_s: float | None = None  # seconds of measurement per level, instead of a request count
    warmup_requests: int | None = None  # None: one per client (0 when only warmup_s is given)
    warmup_s: float | None = None
    rate: float | None = None  # open-loop Poisson arrivals per second, capped at the level's concurrency
    workload: Workload = field(default_factory=Workload)
    slo: SLO = field(default_factory=SLO)
    fraction: float = 0.9
    cliff_tolerance: float = 0.10
    max_error_rate: float = 0.01
    early_stop: bool = True
    request_timeout_s: float = 600.0
    level_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.levels or any(level < 1 for level in self.levels):
            raise ValueError("levels must be positive integers")
        if list(self.levels) != sorted(set(self.levels)):
            raise ValueError("levels must be strictly increasing")
        if self.requests_per_level is not None and self.requests_per_level < 1:
            raise ValueError("requests_per_level must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration_s must be > 0")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate must be > 0")
        if not 0 < self.fraction <= 1:
            raise ValueError("fraction must be in (0, 1]")

    def requests_for(self, concurrency: int) -> int:
        return self.requests_per_level if self.requests_per_level is not None else max(16, 4 * concurrency)

    def warmup_for(self, concurrency: int) -> int:
        if self.warmup_requests is not None:
            return self.warmup_requests
        return 0 if self.warmup_s is not None else concurrency

    def settings(self) -> SweepSettings:
        return SweepSettings(
            levels=list(self.levels),
            mode="poisson" if self.rate is not None else "closed",
            rate=self.rate,
            requests_per_level=self.requests_per_level,
            duration_s=self.duration_s,
            warmup_requests=self.warmup_requests,
            warmup_s=self.warmup_s,
            level_timeout_s=self.level_timeout_s,
            request_timeout_s=self.request_timeout_s,
            workload=self.workload.describe(),
            slo=self.slo,
            fraction=self.fraction,
            cliff_tolerance=self.cliff_tolerance,
            max_error_rate=self.max_error_rate,
            early_stop=self.early_stop,
        )


@dataclass(frozen=True, slots=True)
class SweepEvent:
    """One step of a running sweep, for progress displays. ``done``/``total`` count requests in the
    warm-up and request-count phases, seconds in a timed measurement, requests left in the drain."""

    kind: EventKind
    level_index: int = 0
    levels_total: int = 0
    concurrency: int | None = None
    phase: Phase = ""
    done: float = 0.0
    total: float = 0.0
    elapsed_s: float = 0.0
    level: LevelMetrics | None = None
    message: str = ""
    result: SweepResult | None = None


Progress = Callable[[SweepEvent], None]


class _LevelRun:
    """Collects one level's records and tells the level loop when a phase is complete."""

    def __init__(self, progress: Progress, base: SweepEvent) -> None:
        self.records: list[RequestRecord] = []
        self.changed = asyncio.Event()
        self.window_start: float | None = None
        self.measured = 0
        self._progress = progress
        self._base = base

    def on_record(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self.window_start is not None and record.start >= self.window_start:
            self.measured += 1
        self.changed.set()

    async def wait_change(self) -> None:
        try:
            async with asyncio.timeout(TICK_S):
                await self.changed.wait()
        except TimeoutError:
            pass
        self.changed.clear()

    def emit(self, phase: Phase, done: float, total: float, started: float) -> None:
        self._progress(
            replace(self._base, phase=phase, done=done, total=total, elapsed_s=time.perf_counter() - started)
        )


def _noop(event: SweepEvent) -> None:
    return None


async def run_level(
    client: StreamClient, config: SweepConfig, concurrency: int, *, index: int = 0, progress: Progress = _noop
) -> LevelMetrics:
    """Measure one concurrency level (warm-up, window, drain) and return its metrics, SLOs judged."""
    base = SweepEvent(kind="progress", level_index=index, levels_total=len(config.levels), concurrency=concurrency)
    run = _LevelRun(progress, base)
    factory = RequestFactory(config.workload, stream_id=index + 1)
    generator: ClosedLoopPool | PoissonLoad
    if config.rate is None:
        generator = ClosedLoopPool(client, factory, concurrency=concurrency, on_record=run.on_record)
    else:
        generator = PoissonLoad(
            client,
            factory,
            rate=config.rate,
            max_in_flight=concurrency,
            seed=config.workload.seed + index,
            on_record=run.on_record,
        )
    started = time.perf_counter()
    deadline = started + config.level_timeout_s
    timed_out = False
    generator.start()
    try:
        warm_n, warm_s = config.warmup_for(concurrency), config.warmup_s or 0.0
        while len(run.records) < warm_n or time.perf_counter() - started < warm_s:
            if time.perf_counter() >= deadline:
                timed_out = True
                break
            run.emit("warmup", len(run.records), warm_n, started)
            await run.wait_change()
        # a level that never got through its warm-up is judged on everything it saw
        window_start = run.window_start = started if timed_out else time.perf_counter()
        run.measured = sum(1 for r in run.records if r.start >= window_start)
        want = config.requests_for(concurrency)
        while not timed_out:
            now = time.perf_counter()
            if config.duration_s is not None:
                if now - window_start >= config.duration_s:
                    break
                run.emit("measure", now - window_start, config.duration_s, started)
            else:
                if run.measured >= want:
                    break
                run.emit("measure", run.measured, want, started)
            if now >= deadline:
                timed_out = True
                break
            await run.wait_change()
        window_end = time.perf_counter()
        run.emit("drain", generator.stats().in_flight, generator.stats().in_flight, started)
        await generator.stop(drain_timeout_s=max(5.0, deadline - time.perf_counter()))
    except BaseException:
        await generator.stop(drain_timeout_s=0)
        raise
    metrics = level_metrics(
        run.records,
        concurrency=concurrency,
        window_start=window_start,
        window_end=window_end,
        slo=config.slo,
        rate=config.rate,
        timed_out=timed_out,
    )
    return judge(metrics, config.slo)


async def _preflight(client: StreamClient, config: SweepConfig) -> tuple[str, list[str]]:
    """Find the model (and point ``client`` at it) and send one request, so that a wrong URL or model
    fails in seconds with a clear reason rather than as a sweep full of errors."""
    try:
        models = await client.list_models()
    except Exception as exc:
        if config.model is None:
            raise SweepError(f"cannot list models at {config.url}: {exc}; pass --model to skip this") from exc
        models = []
    model = config.model or (models[0] if models else None)
    if model is None:
        raise SweepError(f"{config.url}/v1/models lists no model; pass --model")
    client.target = replace(client.target, model=model)
    record = await client.send(RequestFactory(config.workload, stream_id=0).next())
    if not record.ok:
        raise SweepError(f"the test request to {client.target.endpoint} (model {model!r}) failed: {record.error}")
    return model, models


def _notes(levels: Sequence[LevelMetrics], counting: TokenCounting) -> list[str]:
    notes: list[str] = []
    if counting in ("chunks", "mixed"):
        notes.append(
            "the server did not report usage for every request: output tokens were counted as content "
            "chunks there, which undercounts when one chunk carries several tokens"
        )
    rejected = sum(lv.rejected for lv in levels)
    if rejected:
        notes.append(
            f"{rejected} requests were answered 429/503 (overload, e.g. a gateway's queue): shown per level, "
            "counted neither as successes nor as backend errors"
        )
    for lv in levels:
        if lv.timed_out:
            notes.append(f"level {lv.concurrency} hit the level time limit before measuring all it wanted")
    return notes


async def run_sweep(config: SweepConfig, progress: Progress | None = None) -> SweepResult:
    """Run the whole sweep against ``config.url`` and return its result (nothing is written)."""
    emit = progress or _noop
    began = time.perf_counter()
    target = Target(config.url, config.api, config.model, config.api_key, config.headers, config.request_timeout_s)
    levels: list[LevelMetrics] = []
    stopped_early = False
    total = len(config.levels)
    async with StreamClient(target) as client:
        model, models = await _preflight(client, config)
        emit(SweepEvent(kind="start", levels_total=total, message=f"sweeping {config.url} (model {model})"))
        for index, concurrency in enumerate(config.levels):
            emit(
                SweepEvent(
                    kind="level_start",
                    level_index=index,
                    levels_total=total,
                    concurrency=concurrency,
                    elapsed_s=time.perf_counter() - began,
                )
            )
            level = await run_level(client, config, concurrency, index=index, progress=emit)
            levels.append(level)
            emit(
                SweepEvent(
                    kind="level_end",
                    level_index=index,
                    levels_total=total,
                    concurrency=concurrency,
                    level=level,
                    elapsed_s=time.perf_counter() - began,
                )
            )
            cliff = detect_cliff(levels, tolerance=config.cliff_tolerance, max_error_rate=config.max_error_rate)
            if cliff is not None and config.early_stop and index < total - 1:
                stopped_early = True
                emit(
                    SweepEvent(
                        kind="stop",
                        level_index=index,
                        levels_total=total,
                        concurrency=concurrency,
                        message=f"cliff: {cliff.reason}; stopping early",
                    )
                )
                break
    verdict = find_sweet_spot(
        levels,
        slo=config.slo,
        fraction=config.fraction,
        tolerance=config.cliff_tolerance,
        max_error_rate=config.max_error_rate,
    )
    counting = _overall_counting(levels)
    result = SweepResult(
        sweetspot_version=gateway.__version__,
        server=ServerInfo(url=config.url, api=config.api, model=model, models=models),
        settings=config.settings(),
        levels=levels,
        peak_tokens_per_s=verdict.peak_tokens_per_s,
        peak_concurrency=verdict.peak_concurrency,
        sweet_spot=verdict.sweet_spot,
        cliff=verdict.cliff,
        verdict=verdict.reason,
        stopped_early=stopped_early,
        token_counting=counting,
        elapsed_s=time.perf_counter() - began,
        notes=_notes(levels, counting),
    )
    emit(SweepEvent(kind="done", levels_total=total, result=result, elapsed_s=result.elapsed_s))
    return result


def _overall_counting(levels: Sequence[LevelMetrics]) -> TokenCounting:
    kinds = {lv.token_counting for lv in levels} - {"none"}
    if not kinds:
        return "none"
    return kinds.pop() if len(kinds) == 1 else "mixed"


def run_sweep_sync(config: SweepConfig, progress: Progress | None = None) -> SweepResult:
    """:func:`run_sweep` for callers without an event loop."""
    return asyncio.run(run_sweep(config, progress))


__all__ = [
    "DEFAULT_LEVELS",
    "Progress",
    "SweepConfig",
    "SweepError",
    "SweepEvent",
    "run_level",
    "run_sweep",
    "run_sweep_sync",
]
