"""The streaming client and the load generators against a small SSE server on loopback.

The server here is a fixture speaking the wire formats we must handle (vLLM-style usage chunk, no
usage, several tokens per chunk, 429 with Retry-After, an error event mid-stream); the client under
test is the real one. The simulator-backed checks live in tests/integration/test_sweep_sim.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.sweep.client import RequestRecord, StreamClient, Target
from gateway.sweep.loadgen import ClosedLoopPool, PoissonLoad
from gateway.sweep.workload import RequestFactory, Workload, parse_length
from testbed.loopback import serving

STEP_S = 0.01


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    mode = request.headers.get("X-Mode", "usage")
    if mode == "busy":
        return web.json_response(
            {"error": {"message": "queue full", "type": "overloaded", "param": None, "code": "queue_full"}},
            status=429,
            headers={"Retry-After": "0.05"},
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    n = int(body["max_tokens"])
    per_chunk = 2 if mode == "pairs" else 1
    chat = "messages" in body
    await response.write(b": keep-alive\n\n")
    if chat:  # some servers send the role before any token: it must not start TTFT's clock
        await response.write(b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n')
        await asyncio.sleep(5 * STEP_S)
    for i in range(0, n, per_chunk):
        await asyncio.sleep(STEP_S)
        if mode == "fail" and i >= 2:
            await response.write(b'data: {"error": {"message": "engine died"}}\n\n')
            return response
        text = "x" * per_chunk
        choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
    include = body.get("stream_options", {}).get("include_usage")
    if include and mode != "no-usage":
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": n + 7}
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "m1"}, {"id": "m2"}]})


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    async with serving(app) as url:
        yield url


async def _send(url: str, mode: str, api: str = "chat", tokens: int = 6) -> RequestRecord:
    target = Target(url + "/v1", api=api, model="m1", headers={"X-Mode": mode})  # type: ignore[arg-type]
    workload = Workload(api=api, prompt_len=parse_length(5), output_len=parse_length(tokens))  # type: ignore[arg-type]
    async with StreamClient(target) as client:
        return await client.send(RequestFactory(workload).next())


async def test_usage_is_the_token_count(server: str) -> None:
    record = await _send(server, "usage")
    assert record.ok and record.status == 200 and record.usage_reported
    assert record.output_tokens == 6 and record.prompt_tokens == 7
    assert len(record.chunk_times) == 6 and len(record.itl) == 5
    assert record.ttft is not None and record.ttft >= 6 * STEP_S  # the early role chunk is not the first token
    assert record.latency is not None and record.latency >= record.ttft
    assert record.tpot == pytest.approx((record.end - record.chunk_times[0]) / 5)


async def test_multi_token_chunks_take_the_usage_count(server: str) -> None:
    record = await _send(server, "pairs", api="completions")
    assert record.ok and record.output_tokens == 6 and len(record.chunk_times) == 3


async def test_without_usage_chunks_are_counted(server: str) -> None:
    record = await _send(server, "no-usage")
    assert record.ok and not record.usage_reported and record.output_tokens == 6


async def test_rejection_is_recorded_with_retry_after(server: str) -> None:
    record = await _send(server, "busy")
    assert not record.ok and record.rejected and record.status == 429
    assert record.retry_after == pytest.approx(0.05) and "queue full" in (record.error or "")


async def test_error_event_mid_stream_fails_the_request(server: str) -> None:
    record = await _send(server, "fail")
    assert not record.ok and record.error_kind == "stream" and "engine died" in (record.error or "")


async def test_connection_refused_is_a_failure_not_an_exception() -> None:
    record = await _send("http://127.0.0.1:9", "usage")
    assert not record.ok and record.error_kind == "connect" and record.status is None


async def test_model_listing(server: str) -> None:
    async with StreamClient(Target(server)) as client:
        assert await client.list_models() == ["m1", "m2"]


async def _until(predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout)


async def test_closed_loop_pool_resizes_live_without_aborting(server: str) -> None:
    records: list[RequestRecord] = []
    workload = Workload(prompt_len=parse_length(5), output_len=parse_length(20))
    async with StreamClient(Target(server, model="m1")) as client:
        pool = ClosedLoopPool(client, RequestFactory(workload), concurrency=2, on_record=records.append)
        async with pool:
            await _until(lambda: pool.stats().in_flight == 2)
            pool.set_concurrency(5)
            await _until(lambda: pool.stats().in_flight == 5)
            pool.set_concurrency(1)
            await _until(lambda: pool.stats().in_flight == 1)
            count = len(records)
            await _until(lambda: len(records) >= count + 2)
            assert pool.stats().in_flight == 1
        stats = pool.stats()
    assert stats.in_flight == 0 and stats.failed == 0 and stats.completed == len(records)
    assert all(r.ok for r in records)  # shrinking and stopping let requests finish
    assert stats.chunks == sum(len(r.chunk_times) for r in records)


async def test_closed_loop_backs_off_on_rejections(server: str) -> None:
    records: list[RequestRecord] = []
    async with (
        StreamClient(Target(server, model="m1", headers={"X-Mode": "busy"})) as client,
        ClosedLoopPool(client, RequestFactory(Workload()), concurrency=1, on_record=records.append),
    ):
        await asyncio.sleep(0.3)
    assert 2 <= len(records) <= 12  # Retry-After 0.05 s paces the client, no hot loop
    assert all(r.rejected for r in records)


async def test_poisson_load_respects_its_cap(server: str) -> None:
    records: list[RequestRecord] = []
    workload = Workload(prompt_len=parse_length(5), output_len=parse_length(10))
    async with StreamClient(Target(server, model="m1")) as client:
        load = PoissonLoad(
            client, RequestFactory(workload), rate=200.0, max_in_flight=3, seed=1, on_record=records.append
        )
        async with load:
            await _until(lambda: len(records) >= 12)
            assert load.stats().in_flight <= 3
    assert all(r.ok for r in records)


def test_what_counts_as_a_token_chunk() -> None:
    from gateway.sweep.client import _carries_token

    assert _carries_token({"delta": {"content": "a"}}, chat=True)
    assert _carries_token({"delta": {"reasoning_content": "hm"}}, chat=True)  # reasoning models
    assert _carries_token({"delta": {"tool_calls": [{"index": 0}]}}, chat=True)
    assert not _carries_token({"delta": {"role": "assistant", "content": ""}}, chat=True)
    assert not _carries_token({"delta": {}, "finish_reason": "stop"}, chat=True)
    assert _carries_token({"text": " x"}, chat=False) and not _carries_token({"text": ""}, chat=False)


async def test_poisson_load_keeps_its_rate_on_a_lagging_event_loop(server: str) -> None:
    """Gaps are counted from when each arrival was due, so a loop that wakes 20 ms late at every turn still sends
    about ``rate`` requests a second (counted from each wake-up, it would send about 1 / (10 ms + 20 ms) = 33/s)."""

    async def hog() -> None:
        while True:
            time.sleep(0.02)  # blocks the event loop, as a busy client process does
            await asyncio.sleep(0)

    workload = Workload(prompt_len=parse_length(5), output_len=parse_length(2))
    async with StreamClient(Target(server, model="m1")) as client:
        load = PoissonLoad(client, RequestFactory(workload), rate=100.0, seed=3)
        lagging = asyncio.ensure_future(hog())
        try:
            async with load:
                began = time.perf_counter()
                await asyncio.sleep(1.5)
                sent = load.stats().started
                elapsed = time.perf_counter() - began
        finally:
            lagging.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lagging
    assert sent >= 0.7 * 100.0 * elapsed, (sent, elapsed)
