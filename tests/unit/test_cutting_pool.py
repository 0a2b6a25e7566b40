"""``testbed.closed_loop.CuttingPool``: at the end of a measured run, the requests with no first token yet are
hung up and the others finish (the benches' drain lasts one answer, not the queue's worth of them)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.sweep.client import RequestRecord, StreamClient, Target
from gateway.sweep.workload import RequestFactory, Workload, parse_length
from testbed.closed_loop import CuttingPool
from testbed.loopback import serving

SLOTS = 2
TOKENS = 20
STEP_S = 0.02  # an answer lasts 0.4 s


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    """A server with 2 slots: a request waits for one before its first token (headers sent, nothing else)."""
    slots = asyncio.Semaphore(SLOTS)
    ends: list[str] = []  # "done" or "hung up", per request that held a slot or waited for one

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            async with slots:
                for _ in range(TOKENS):
                    await asyncio.sleep(STEP_S)
                    chunk = {"choices": [{"index": 0, "text": "x"}]}
                    await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await response.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            ends.append("hung up")
            raise
        ends.append("done")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    async with serving(app) as url:
        yield url, ends


async def test_cut_hangs_up_the_requests_without_a_first_token(server: tuple[str, list[str]]) -> None:
    url, ends = server
    records: list[RequestRecord] = []
    workload = Workload(api="completions", prompt_len=parse_length(5), output_len=parse_length(TOKENS))
    async with StreamClient(Target(url, api="completions", model="m")) as client:
        pool = CuttingPool(client, RequestFactory(workload), concurrency=6, on_record=records.append)
        pool.start()
        deadline = time.monotonic() + 10
        while pool.stats().chunks < 2 * SLOTS:  # both slots streaming, four requests waiting
            assert time.monotonic() < deadline, pool.stats()
            await asyncio.sleep(0.01)
        await pool.cut(drain_timeout_s=30)
        stats = pool.stats()
    assert stats.in_flight == 0 and stats.failed == 0
    # the two streaming answers finished whole; the four waiting were hung up, with no record (a plain stop
    # would have served them one slot after another: six records)
    assert len(records) == SLOTS and all(r.ok and len(r.chunk_times) == TOKENS for r in records)
    await asyncio.sleep(0.1)  # the server sees the hang-ups
    assert ends.count("done") == SLOTS
