"""Closed-loop load through one gateway, and the rotated rounds that compare the controller with static limits.

The controller tests against real servers (llama-server, vLLM) all ask one question: under a closed-loop load
above the server's knee, does the controller deliver at least 0.9 x the throughput of the best static limit,
measured in the same test? On a shared 2-core machine single runs swing by tens of percent, so each
configuration runs in short runs whose order rotates each round, and the controller is compared with each
static limit round by round (runs seconds apart), the median of those ratios. Whole columns are not compared:
the machine's other work drifts over a test, and then they compare one configuration's early runs with
another's late ones.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import aiohttp

from gateway.control.window import percentile
from gateway.sweep.client import RequestRecord, StreamClient, Target
from gateway.sweep.loadgen import ClosedLoopPool
from gateway.sweep.workload import RequestFactory, Workload
from testbed.gateway import Start, get_json, start_gateway

# The controller's faster settings for tests that must converge within a minute: a tick every 0.5 s instead
# of 2 s, 1 s to settle and 2 s per throughput reading, a 5 s window, a re-probe every 10 s of busy time and
# the backend's /metrics scraped every 0.5 s (the hard cap is known at once); why each, in
# ``tests/integration/test_controller_llama.py``.
FAST_CONTROL = {
    "SWEETSPOT_CONTROL_INTERVAL_S": "0.5",
    "SWEETSPOT_SETTLE_S": "1",
    "SWEETSPOT_MEASURE_S": "2",
    "SWEETSPOT_WINDOW_S": "5",
    "SWEETSPOT_REPROBE_S": "10",
    "SWEETSPOT_METRICS_INTERVAL_S": "0.5",
}

Tick = Callable[[], None]


def start_configurations(
    start: Start, upstream: str, static_limits: Iterable[int], env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """One gateway per configuration in front of ``upstream``: "controller" (default settings but
    ``FAST_CONTROL``, then ``env``), and "static K" (``--no-control --initial-limit K``) for each K; their
    URLs by name. Started side by side: each takes a second or two to import and start."""
    configs: dict[str, tuple[str, ...]] = {"controller": ()}
    configs |= {f"static {k}": ("--no-control", "--initial-limit", str(k)) for k in static_limits}
    with ThreadPoolExecutor(len(configs)) as pool:
        started = {
            name: pool.submit(start_gateway, start, [upstream], *args, env={**FAST_CONTROL, **(env or {})})
            for name, args in configs.items()
        }
        return {name: future.result().url for name, future in started.items()}


def upstream_state(gateway: str) -> dict:
    return get_json(f"{gateway}/state")["upstreams"][0]


def limit_of(gateway: str) -> int:
    return int(upstream_state(gateway)["limit"])


def explored_below(gateway: str, cap: int) -> bool:
    """Whether the controller at ``gateway`` holds ``cap`` again with a settled reading below it on its curve:
    the question it asks at a hard cap (does the knee lie lower?) answered. Keys of first readings carry a
    ``~`` (``Curve.as_dict``) and do not count."""
    state = upstream_state(gateway)
    curve = state["controller"]["algorithm"].get("curve", {})
    return int(state["limit"]) == cap and any(key.isdigit() and int(key) < cap for key in curve)


@dataclass(frozen=True)
class Interval:
    """The measured part of a run: a count read at its start and end, and when (``perf_counter``)."""

    before: float
    after: float
    start: float
    end: float

    @property
    def rate(self) -> float:
        return (self.after - self.before) / (self.end - self.start)


async def _measure(
    seconds: float,
    warmup_s: float,
    on_tick: Tick | None,
    read: Callable[[], float] | None,
    until: Callable[[], bool] | None = None,
) -> Interval:
    """Wait out the warm-up, then ``seconds`` calling ``on_tick`` every 0.5 s (ending early once ``until``
    holds, asked after each tick); ``read`` (a count) at both ends."""

    async def count() -> float:
        return 0.0 if read is None else await asyncio.to_thread(read)

    await asyncio.sleep(warmup_s)
    before, t0 = await count(), time.perf_counter()
    deadline = t0 + seconds
    while (now := time.perf_counter()) < deadline:
        if on_tick is not None:
            on_tick()
        if until is not None and until():
            break
        await asyncio.sleep(min(0.5, deadline - now))
    after, t1 = await count(), time.perf_counter()
    return Interval(before, after, t0, t1)


@dataclass(frozen=True)
class Objectives:
    """Per-request objectives, as the controller's and the scenario harness's goodput apply them: a request
    counts only when its TTFT net of the gateway's queue (``X-Sweetspot-Queue-Seconds``) and its TPOT are
    within them."""

    ttft_s: float
    tpot_s: float

    def met(self, record: RequestRecord) -> bool:
        ttft, tpot = record.upstream_ttft, record.tpot
        return record.ok and ttft is not None and ttft <= self.ttft_s and (tpot is None or tpot <= self.tpot_s)


@dataclass(frozen=True)
class Run:
    """One run's output tokens/s, and (when objectives were given) its goodput: the tokens of requests that met
    them, each request's tokens spread from its first token to its end, inside the measured interval; with
    them, the p99 latencies of the requests whose first token fell inside it (TTFT as the client saw it, and
    net of the gateway's queue, which is what the objective judges)."""

    tokens_per_s: float
    goodput_per_s: float | None = None
    ttft_p99: float | None = None
    upstream_ttft_p99: float | None = None
    tpot_p99: float | None = None


class CuttingPool(ClosedLoopPool):
    """A closed loop whose :meth:`cut` hangs up the requests that have no first token yet (queued in the
    gateway or the server) and lets the others finish. After a measured interval those requests' tokens all
    fall outside it, so cutting them changes no figure of the run, and the drain lasts one answer, not the
    whole queue's worth of them (at a limit of 4 under 33 clients, eight answers' time)."""

    def __init__(self, client: StreamClient, factory: RequestFactory, *, concurrency: int, **kwargs: object) -> None:
        super().__init__(client, factory, concurrency=concurrency, **kwargs)
        self._unstarted: set[asyncio.Task[object]] = set()

    def _count_chunk(self) -> None:
        super()._count_chunk()
        task = asyncio.current_task()  # the client's task: on_chunk runs inside its request
        if task is not None:
            self._unstarted.discard(task)

    async def _send_one(self) -> RequestRecord:
        task = asyncio.current_task()
        assert task is not None
        self._unstarted.add(task)
        try:
            return await super()._send_one()
        finally:
            self._unstarted.discard(task)

    async def cut(self, drain_timeout_s: float) -> None:
        """Send nothing new, hang up the requests without a first token, let the rest finish."""
        self._stopping.set()
        for task in list(self._unstarted):
            task.cancel()
        await self.stop(drain_timeout_s=drain_timeout_s)


async def stream_load(
    gateway: str,
    *,
    model: str,
    workload: Workload,
    clients: int,
    seconds: float,
    warmup_s: float,
    on_tick: Tick | None = None,
    until: Callable[[], bool] | None = None,
    tokens: Callable[[], float] | None = None,
    objectives: Objectives | None = None,
    cut_unstarted: bool = False,
) -> Run:
    """``clients`` closed-loop streaming clients for ``warmup_s + seconds``: output tokens/s after the warm-up,
    by ``tokens`` (a counter such as the server's own, read before and after) or else by the chunks received
    (the tiny test models stream one token per chunk). Without objectives the clients hang up at the end, so
    the gateway frees its permits and the server its slots at once; with them the requests in flight finish,
    since their tokens inside the interval count towards goodput (``cut_unstarted``: only those that have
    their first token, :class:`CuttingPool`)."""
    records: list[RequestRecord] = []
    async with StreamClient(Target(gateway, api="completions", model=model)) as client:
        pool = CuttingPool(client, RequestFactory(workload), concurrency=clients, on_record=records.append)
        pool.start()
        try:
            chunks = tokens or (lambda: float(pool.stats().chunks))
            measured = await _measure(seconds, warmup_s, on_tick, chunks, until)
            stats = pool.stats()
        finally:
            if objectives is not None and cut_unstarted:
                await pool.cut(drain_timeout_s=300)
            else:
                await pool.stop(drain_timeout_s=0 if objectives is None else 300)
    assert stats.failed == 0, f"{stats.failed} requests failed through {gateway}"
    if objectives is None:
        return Run(measured.rate)
    good = [
        (r.chunk_times[0], r.end or r.chunk_times[-1], r.output_tokens)
        for r in records
        if objectives.met(r) and r.chunk_times
    ]
    inside = [r for r in records if r.ok and r.chunk_times and measured.start <= r.chunk_times[0] <= measured.end]

    def p99(values: Iterable[float | None]) -> float | None:
        return percentile([v for v in values if v is not None], 99)

    return Run(
        measured.rate,
        spread(good, measured.start, measured.end) / (measured.end - measured.start),
        ttft_p99=p99(r.ttft for r in inside),
        upstream_ttft_p99=p99(r.upstream_ttft for r in inside),
        tpot_p99=p99(r.tpot for r in inside),
    )


def spread(answers: list[tuple[float, float, int]], begin: float, end: float) -> float:
    """Tokens inside ``[begin, end]``, each answer's spread evenly over its life (an unbiased count of a steady
    load's tokens in any interval, when a whole answer's tokens are seen only at its end)."""
    total = 0.0
    for start, finish, count in answers:
        if finish <= start:
            continue
        total += count * max(0.0, min(finish, end) - max(start, begin)) / (finish - start)
    return total


async def whole_load(
    gateway: str,
    *,
    model: str,
    workload: Workload,
    clients: int,
    seconds: float,
    warmup_s: float,
    on_tick: Tick | None = None,
    until: Callable[[], bool] | None = None,
    tokens: Callable[[], float] | None = None,
) -> Run:
    """``clients`` closed-loop clients asking for whole (non-streamed) answers for ``warmup_s + seconds``:
    output tokens/s inside the measured interval, by ``tokens`` (a server counter that moves as tokens are
    generated) or else each answer's count spread over its life, the answers in flight at the end let finish
    to know their counts."""
    factory = RequestFactory(workload)
    answers: list[tuple[float, float, int]] = []
    failures: list[str] = []
    stopping = asyncio.Event()
    url = f"{gateway}/v1/completions"

    async def client(session: aiohttp.ClientSession) -> None:
        while not stopping.is_set():
            body = dict(factory.next().body, model=model, stream=False)
            body.pop("stream_options", None)
            start = time.perf_counter()
            async with session.post(url, json=body) as resp:
                payload = await resp.json(content_type=None)
            if resp.status != 200:
                failures.append(f"HTTP {resp.status}: {payload}")
                continue
            answers.append((start, time.perf_counter(), int(payload["usage"]["completion_tokens"])))

    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(clients)]
        try:
            measured = await _measure(seconds, warmup_s, on_tick, tokens, until)
            stopping.set()
            if tokens is None:
                await asyncio.gather(*tasks)  # the answers in flight at the end finish: their counts are needed
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert not failures, f"{len(failures)} requests failed through {gateway}: {failures[:3]}"
    if tokens is not None:
        return Run(measured.rate)
    return Run(spread(answers, measured.start, measured.end) / (measured.end - measured.start))


@dataclass
class Comparison:
    """Every run's tokens/s by configuration, and the controller against each static limit."""

    runs: dict[str, list[float]]

    @property
    def paired(self) -> dict[str, float]:
        """Controller / static, round by round, the median over the rounds, for each static configuration. A
        static run that delivered nothing (every request outside the objectives) counts as infinitely worse.
        Every configuration has one run per round (``rotated_rounds``), so the runs pair up."""
        mine = self.runs["controller"]
        return {
            name: statistics.median(c / s if s > 0 else math.inf for c, s in zip(mine, values, strict=True))
            for name, values in self.runs.items()
            if name != "controller"
        }

    @property
    def best_static(self) -> str:
        """The static configuration the controller compares worst with."""
        paired = self.paired
        return min(paired, key=paired.__getitem__)

    def holds(self, static: str, settled: list[int], floor: float = 0.9) -> bool:
        """The controller delivered at least ``floor`` x the ``static`` configuration's tokens/s, or it ran at
        exactly that limit through every measured run (``settled``: its limit at each tick of them). In the
        second case the controller *was* that configuration, so what its ratio measures is the shared machine's
        noise (runs of the same configuration spread by +-15% here), not the controller."""
        same_limit = bool(settled) and set(settled) == {int(static.removeprefix("static "))}
        return same_limit or self.paired[static] >= floor

    def holds_the_best_static(self, settled: list[int], floor: float = 0.9) -> bool:
        """:meth:`holds` for the static configuration the controller compares worst with."""
        return self.holds(self.best_static, settled, floor)

    def report(self) -> str:
        medians = {name: round(statistics.median(values)) for name, values in self.runs.items()}
        return (
            f"tokens/s per run { ({n: [round(v) for v in vs] for n, vs in self.runs.items()}) }; medians "
            f"{medians}; controller / static, median of the rounds "
            f"{ ({n: round(r, 3) for n, r in self.paired.items()}) }; best static: {self.best_static}"
        )


async def rotated_rounds(names: list[str], rounds: int, run: Callable[[str], Awaitable[float]]) -> Comparison:
    """``rounds`` passes over ``names`` (one of them "controller"), each starting one further along."""
    runs: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(await run(name))
    return Comparison(runs)
