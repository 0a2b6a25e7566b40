"""Drive the pure engine in real time (scaled) from asyncio, and publish its tokens to handlers.

One background task steps the engine back to back, as a GPU would: it starts a step, sleeps
until the step's end on the wall clock (engine seconds / ``time_scale``), then hands the step's
tokens to the waiting request handlers and records the metrics. Steps are chained on engine
time, not on when the event loop happened to wake up, so timer jitter does not leak into
throughput. If the process falls behind by more than ``max_lag_s`` of wall time (an overloaded
machine), the engine clock jumps forward instead of bursting to catch up, and ``lag_resets``
counts it: the simulator then honestly delivers less than the model predicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from gateway.sim.engine import Engine, StepResult
from gateway.sim.exposition import VllmMetrics

log = logging.getLogger("gateway.sim")


class Handle:
    """A request's view of its sequence: how many tokens are ready, and whether it has finished."""

    __slots__ = ("done", "event", "finish_reason", "last_token_v", "max_tokens", "prompt_tokens", "ready", "sid")

    def __init__(self, sid: int, prompt_tokens: int, max_tokens: int) -> None:
        self.sid = sid
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.ready = 0
        self.done = False
        self.finish_reason: str | None = None
        self.event = asyncio.Event()
        self.last_token_v = 0.0

    async def wait_done(self) -> None:
        while not self.done:
            await self.event.wait()
            self.event.clear()


class EngineRunner:
    """Owns the engine inside the server; the only code that calls ``engine.step``."""

    def __init__(
        self,
        engine: Engine,
        metrics: VllmMetrics,
        *,
        time_scale: float = 1.0,
        max_lag_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.engine = engine
        self.metrics = metrics
        self.time_scale = time_scale
        self.max_lag_s = max_lag_s
        self._clock = clock
        self._t0 = clock()
        self._handles: dict[int, Handle] = {}
        self._wake = asyncio.Event()
        self._stepping = False  # True while steps are chained back to back
        self._task: asyncio.Task[None] | None = None
        self.lag_resets = 0
        self._seen_preemptions = 0
        self._seen_prompt = 0
        self._seen_prefix = (0, 0)  # prefix-cache queries and hits already exported
        self._seen_lora_loads = 0

    # ------------------------------------------------------------- clocks
    def vnow(self) -> float:
        """Engine time now: wall seconds since start x time_scale."""
        return (self._clock() - self._t0) * self.time_scale

    def to_wall(self, v: float) -> float:
        return v / self.time_scale

    # ------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ------------------------------------------------------------- requests
    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        *,
        ignore_eos: bool,
        block_hashes: tuple[int, ...] = (),
        lora: str | None = None,
    ) -> Handle:
        """Queue a request (may raise ``InjectedError`` or ``ValueError`` from the engine)."""
        now = self.vnow()
        if self._stepping and self.engine.busy_until < now:
            now = self.engine.busy_until  # the engine is behind; do not arrive after its next step
        sid = self.engine.submit(
            prompt_tokens, max_tokens, now, ignore_eos=ignore_eos, block_hashes=block_hashes, lora=lora
        )
        handle = Handle(sid, prompt_tokens, max_tokens)
        self._handles[sid] = handle
        m = self.metrics
        m.params_max_tokens.observe(max_tokens)
        m.params_n.observe(1)
        m.max_num_generation_tokens.observe(max_tokens)
        self._refresh_gauges()
        self._wake.set()
        return handle

    def abort(self, handle: Handle) -> None:
        """The client went away: free the sequence's KV now, as vLLM does."""
        if handle.done:
            return
        if self.engine.abort(handle.sid, self.vnow()):
            self._finished(handle.sid)
            self._refresh_gauges()

    def scenario_changed(self) -> None:
        """Wake the loop so a lifted stall or a larger KV pool takes effect at once."""
        self._wake.set()

    # ------------------------------------------------------------- the loop
    async def _run(self) -> None:
        engine = self.engine
        while True:
            if not engine.has_work:
                self._stepping = False
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self.vnow()
            if self._stepping and now - engine.busy_until <= self.max_lag_s * self.time_scale:
                start = engine.busy_until
            else:
                if self._stepping:
                    self.lag_resets += 1
                start = now
            res = engine.step(start)
            if res is None:
                self._stepping = False
                stalled = engine.scenario.stalled_until
                self._wake.clear()
                if stalled > now:
                    delay = self.to_wall(stalled - now)
                    try:
                        async with asyncio.timeout(delay):
                            await self._wake.wait()
                    except TimeoutError:
                        pass
                else:  # nothing schedulable (e.g. the pool shrank under a lone sequence)
                    await self._wake.wait()
                continue
            self._stepping = True
            delay = self.to_wall(res.end) - (self._clock() - self._t0)
            if delay > 0:
                await asyncio.sleep(delay)
            self._publish(res)

    def _publish(self, res: StepResult) -> None:
        m = self.metrics
        engine = self.engine
        handles = self._handles
        end = res.end
        scale = self.time_scale
        first = set(res.first_tokens)
        itl = m.itl
        for sid in res.tokens:
            h = handles.get(sid)
            if h is None:
                continue
            if sid in first:
                m.ttft.observe((end - engine.seq(sid).arrival) / scale)
            else:
                itl.observe((end - h.last_token_v) / scale)
            h.last_token_v = end
            h.ready += 1
            h.event.set()
        for sid in res.finished:
            self._finished(sid)
        m.generation_tokens.inc(len(res.tokens))
        m.iteration_tokens.observe(res.prefill_tokens + len(res.tokens))
        if engine.prompt_tokens_total != self._seen_prompt:
            m.prompt_tokens.inc(engine.prompt_tokens_total - self._seen_prompt)
            self._seen_prompt = engine.prompt_tokens_total
        prefix = (engine.prefix_queries_total, engine.prefix_hits_total)
        if prefix != self._seen_prefix:
            m.prefix_queries.inc(prefix[0] - self._seen_prefix[0])
            m.prefix_hits.inc(prefix[1] - self._seen_prefix[1])
            self._seen_prefix = prefix
        adapters = engine.adapters
        if adapters is not None and m.lora_loads is not None and adapters.loads_total != self._seen_lora_loads:
            m.lora_loads.inc(adapters.loads_total - self._seen_lora_loads)
            self._seen_lora_loads = adapters.loads_total
        if engine.num_preemptions != self._seen_preemptions:
            m.preemptions.inc(engine.num_preemptions - self._seen_preemptions)
            self._seen_preemptions = engine.num_preemptions
        self._refresh_gauges()

    def _finished(self, sid: int) -> None:
        """Record a finished sequence's request metrics, wake its handler, drop the record."""
        engine = self.engine
        seq = engine.seq(sid)
        h = self._handles.pop(sid, None)
        m = self.metrics
        scale = self.time_scale
        reason = seq.finish_reason or "abort"
        m.success[reason].inc()
        end = seq.finished_at if seq.finished_at is not None else self.vnow()
        m.e2e.observe((end - seq.arrival) / scale)
        m.req_prompt_tokens.observe(seq.prompt_len)
        m.req_generation_tokens.observe(seq.generated)
        if seq.scheduled_at is not None:
            m.queue_time.observe((seq.scheduled_at - seq.arrival) / scale)
            m.inference_time.observe((end - seq.scheduled_at) / scale)
            if seq.first_token_at is not None:
                m.prefill_time.observe((seq.first_token_at - seq.scheduled_at) / scale)
                m.decode_time.observe((end - seq.first_token_at) / scale)
                if seq.generated > 1:
                    m.request_tpot.observe((end - seq.first_token_at) / (seq.generated - 1) / scale)
        engine.forget(sid)
        if h is not None:
            h.finish_reason = reason
            h.done = True
            h.event.set()

    def _refresh_gauges(self) -> None:
        m = self.metrics
        e = self.engine
        m.running.set(e.num_running)
        m.waiting.set(e.num_waiting)
        m.kv_usage.set(e.kv_usage)
        if e.adapters is not None:
            m.set_lora(e.running_adapters(), e.waiting_adapters())
