"""Load generators: a closed-loop client pool and an open-loop Poisson source, both resizable live.

Closed loop (the default of a sweep) is N clients that each send a request, wait for its last byte and
send the next: the server sees exactly N requests in flight, which is the quantity the sweet spot is
expressed in. Open loop sends on a Poisson clock at a given rate whatever the server does (the way
``vllm bench serve --request-rate`` does), optionally capped at N in flight; arrivals over the cap wait
on the client side, and their latency clock starts when they are sent, as in vLLM.

Both can change their concurrency (and the Poisson source its rate) while they run, so a demo can move
its client load over time. A shrinking pool never aborts a request: surplus clients leave after their
current one. Every finished request is handed to ``on_record``; :meth:`stats` gives live counters.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.sweep.client import RequestRecord, StreamClient
from gateway.sweep.workload import RequestFactory

RecordSink = Callable[[RequestRecord], None]


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Counters since the generator started; diff two snapshots for rates."""

    concurrency: int
    in_flight: int
    waiting: int  # open loop: arrivals held back by the concurrency cap
    started: int
    completed: int
    ok: int
    failed: int
    rejected: int
    chunks: int
    output_tokens: int


class _LoadGenerator:
    """Shared bookkeeping: sending one request, counters, stop/drain."""

    def __init__(
        self,
        client: StreamClient,
        factory: RequestFactory,
        *,
        on_record: RecordSink | None = None,
        error_backoff_s: float = 0.25,
        max_backoff_s: float = 5.0,
    ) -> None:
        self._client = client
        self._factory = factory
        self._on_record = on_record
        self._error_backoff_s = error_backoff_s
        self._max_backoff_s = max_backoff_s
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._concurrency = 0
        self._in_flight = 0
        self._started = self._completed = self._ok = self._failed = self._rejected = 0
        self._chunks = self._output_tokens = 0

    @property
    def concurrency(self) -> int:
        return self._concurrency

    def stats(self) -> PoolStats:
        return PoolStats(
            concurrency=self._concurrency,
            in_flight=self._in_flight,
            waiting=self._waiting(),
            started=self._started,
            completed=self._completed,
            ok=self._ok,
            failed=self._failed,
            rejected=self._rejected,
            chunks=self._chunks,
            output_tokens=self._output_tokens,
        )

    def _waiting(self) -> int:
        return 0

    def _count_chunk(self) -> None:
        self._chunks += 1

    async def _send_one(self) -> RequestRecord:
        spec = self._factory.next()
        self._in_flight += 1
        self._started += 1
        try:
            record = await self._client.send(spec, on_chunk=self._count_chunk)
        finally:
            self._in_flight -= 1
        self._completed += 1
        if record.ok:
            self._ok += 1
            self._output_tokens += record.output_tokens
        elif record.rejected:
            self._rejected += 1
        else:
            self._failed += 1
        if self._on_record is not None:
            self._on_record(record)
        return record

    def _backoff_s(self, record: RequestRecord) -> float:
        if record.ok:
            return 0.0
        return min(record.retry_after or self._error_backoff_s, self._max_backoff_s)

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake up at once when the generator stops."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._stopping.wait()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self, *, drain_timeout_s: float | None = 60.0) -> None:
        """Send nothing new; let requests in flight finish (up to the timeout), then abort the rest.

        Aborted requests produce no record: they were cut by us, not by the server.
        """
        self._stopping.set()
        pending = set(self._tasks)
        if pending:
            _, still = await asyncio.wait(pending, timeout=drain_timeout_s)
            for task in still:
                task.cancel()
            if still:
                await asyncio.gather(*still, return_exceptions=True)

    def start(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> _LoadGenerator:
        """Start sending (the generator must be created inside the running event loop)."""
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(drain_timeout_s=0 if exc[0] is not None else 60.0)


class ClosedLoopPool(_LoadGenerator):
    """N clients, each sending its next request when the previous one ended."""

    def __init__(self, client: StreamClient, factory: RequestFactory, *, concurrency: int, **kwargs: object) -> None:
        super().__init__(client, factory, **kwargs)  # type: ignore[arg-type]
        if concurrency < 0:
            raise ValueError("concurrency must be >= 0")
        self._workers: dict[int, asyncio.Task[None]] = {}
        self._concurrency = concurrency

    def start(self) -> None:
        """Start the clients (call from inside the running event loop)."""
        self.set_concurrency(self._concurrency)

    def set_concurrency(self, concurrency: int) -> None:
        """Grow at once; shrink as surplus clients finish their current request."""
        if concurrency < 0:
            raise ValueError("concurrency must be >= 0")
        self._concurrency = concurrency
        if self._stopping.is_set():
            return
        for worker_id in range(concurrency):
            task = self._workers.get(worker_id)
            if task is None or task.done():
                self._workers[worker_id] = self._spawn(self._worker(worker_id))

    async def _worker(self, worker_id: int) -> None:
        while not self._stopping.is_set() and worker_id < self._concurrency:
            record = await self._send_one()
            await self._pause(self._backoff_s(record))


class PoissonLoad(_LoadGenerator):
    """Requests at Poisson-distributed times, ``rate`` per second, at most ``max_in_flight`` at once."""

    def __init__(
        self,
        client: StreamClient,
        factory: RequestFactory,
        *,
        rate: float,
        max_in_flight: int | None = None,
        seed: int = 0,
        **kwargs: object,
    ) -> None:
        super().__init__(client, factory, **kwargs)  # type: ignore[arg-type]
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self._rate = rate
        self._concurrency = max_in_flight or 0  # 0: no cap
        self._rng = np.random.default_rng(seed)
        self._backlog = 0
        self._arrivals: asyncio.Task[None] | None = None

    @property
    def rate(self) -> float:
        return self._rate

    def set_rate(self, rate: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self._rate = rate

    def set_concurrency(self, concurrency: int) -> None:
        """Change the in-flight cap (0 removes it); waiting arrivals are released at once if room."""
        self._concurrency = max(0, concurrency)
        self._dispatch()

    def start(self) -> None:
        self._arrivals = self._spawn(self._arrive())

    def _waiting(self) -> int:
        return self._backlog

    async def _arrive(self) -> None:
        # Each arrival is due one exponential gap after the previous one was *due*, not after the loop woke up
        # for it: a busy event loop wakes late, and gaps counted from the wake-up would lower the rate by that
        # lag at every arrival (a demo on a loaded machine sent 17 of the 22 requests/s asked for). Every
        # arrival due by the time the loop wakes is sent then, as a Poisson source would have sent them meanwhile.
        loop = asyncio.get_running_loop()
        due = loop.time() + float(self._rng.exponential(1.0 / self._rate))
        while not self._stopping.is_set():
            await self._pause(due - loop.time())
            if self._stopping.is_set():
                break
            now = loop.time()
            while due <= now:
                self._backlog += 1
                due += float(self._rng.exponential(1.0 / self._rate))
            self._dispatch()

    def _dispatch(self) -> None:
        while self._backlog and not self._stopping.is_set():
            if self._concurrency and self._in_flight >= self._concurrency:
                return
            self._backlog -= 1
            self._in_flight += 1  # reserve the slot now; _send_one counts it properly
            self._spawn(self._run_one())

    async def _run_one(self) -> None:
        self._in_flight -= 1
        try:
            await self._send_one()
        finally:
            self._dispatch()

    async def stop(self, *, drain_timeout_s: float | None = 60.0) -> None:
        self._backlog = 0  # arrivals not yet sent are simply never sent
        await super().stop(drain_timeout_s=drain_timeout_s)
