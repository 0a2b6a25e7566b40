"""A short concurrency sweep of the running simulator must match the pure model's prediction.

Closed-loop streaming clients (aiohttp, counting SSE events as they arrive) at a few levels; the
window is the oracle's: from the moment every client has finished one request to the moment
every client has finished ``1 + MEASURED`` requests (clients keep going until then). The
simulator runs at a modest time scale so the whole sweep takes seconds without loading this
2-core machine so much that the measurement becomes about the machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest

from gateway.common.processes import LISTENING, RunningProcess, start_process, sweetspot
from gateway.sim.oracle import predict_closed_loop
from gateway.sim.profiles import QWEN36_35B_A3B_32GB

TIME_SCALE = 4.0
PROMPT, OUTPUT = 256, 128
LEVELS = (1, 8, 24)
MEASURED = 3  # requests per client inside the window


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningProcess]:
    # The oracle's engine gets no prompt hashes, so it models no prefix cache: the server under test neither.
    cmd = sweetspot("sim", "--port", "0", "--time-scale", str(TIME_SCALE), "--no-prefix-caching")
    with start_process(cmd, ready_pattern=LISTENING, ready_url="{url}/health", timeout=60) as proc:
        yield proc


async def measure(url: str, concurrency: int) -> float:
    """Streamed tokens per wall second over the window, at ``concurrency`` closed-loop clients."""
    body = {"prompt": [3] * PROMPT, "max_tokens": OUTPUT, "ignore_eos": True, "stream": True}
    arrivals: list[float] = []
    done = [0] * concurrency
    marks: dict[str, float] = {}
    finished = asyncio.Event()

    def mark(target: int, key: str) -> None:
        if key not in marks and min(done) >= target:
            marks[key] = time.monotonic()
            if key == "t1":
                finished.set()

    async def client(i: int, session: aiohttp.ClientSession) -> None:
        while True:
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        arrivals.append(time.monotonic())
            done[i] += 1
            mark(1, "t0")
            mark(1 + MEASURED, "t1")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [asyncio.create_task(client(i, session)) for i in range(concurrency)]
        waiter = asyncio.create_task(finished.wait())
        await asyncio.wait([waiter, *tasks], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            if t.done() and t.exception():
                raise t.exception()  # type: ignore[misc]
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert "t1" in marks, f"sweep level {concurrency} did not finish in time"
    t0, t1 = marks["t0"], marks["t1"]
    return sum(1 for a in arrivals if t0 < a <= t1) / (t1 - t0)


@pytest.mark.parametrize("concurrency", LEVELS)
def test_measured_throughput_matches_the_model(sim: RunningProcess, concurrency: int) -> None:
    predicted = (
        predict_closed_loop(QWEN36_35B_A3B_32GB, concurrency, PROMPT, OUTPUT, measure_requests=MEASURED).tokens_per_s
        * TIME_SCALE
    )
    measured = asyncio.run(measure(sim.url, concurrency))
    assert measured == pytest.approx(predicted, rel=0.15), (
        f"{concurrency} clients: measured {measured:.0f} tok/s (wall), model predicts {predicted:.0f}"
    )
