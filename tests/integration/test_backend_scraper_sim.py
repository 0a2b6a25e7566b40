"""The backend scraper over real HTTP: against ``sweetspot sim`` (vLLM's metric names) and dead addresses.

What a consumer relies on: the kind is detected from what the server answers, the numbers are vLLM's,
and a server that stops answering leaves the last numbers in place with an error and a growing age,
without raising.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from gateway.common.processes import free_port
from gateway.sim.profiles import QWEN36_35B_A3B_32GB
from gateway.telemetry.backends import BackendScraper
from testbed.gateway import start_sim

OUTPUT_TOKENS = 400


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_detects_vllm_on_the_simulator_and_reads_its_numbers(processes) -> None:
    sim = start_sim(processes, "--seed", "3", time_scale=5.0)
    client = openai.AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0, timeout=60)
    model = (await client.models.list()).data[0].id
    async with BackendScraper(sim.url) as scraper:
        idle = await scraper.scrape()
        assert scraper.kind == "vllm"
        assert idle.error is None and idle.healthy is True
        assert (idle.running, idle.waiting) == (0.0, 0.0)
        assert idle.kv_capacity_tokens == QWEN36_35B_A3B_32GB.kv_capacity_tokens
        assert idle.generation_tokens_total == 0.0

        # long enough to be seen running by a scrape on a cold, busy machine (40 tokens at 5x real time once
        # ended between two scrapes of a clean-clone run)
        async def one() -> None:
            await client.completions.create(model=model, prompt="hello " * 50, max_tokens=OUTPUT_TOKENS)

        tasks = [asyncio.create_task(one()) for _ in range(6)]
        busy = idle
        for _ in range(200):  # until the engine reports them running
            busy = await scraper.scrape()
            if busy.running:
                break
            await asyncio.sleep(0.02)
        assert busy.running and busy.running > 0
        assert busy.kv_usage is not None and busy.kv_usage > 0
        await asyncio.gather(*tasks)
        done = await scraper.scrape()
        assert done.generation_tokens_total == 6 * OUTPUT_TOKENS
        assert done.itl_count is not None and done.itl_count > 0  # vllm:inter_token_latency_seconds
    await client.close()


async def test_stopped_server_leaves_stale_numbers_and_an_error(processes) -> None:
    sim = start_sim(processes, "--seed", "4")
    clock = FakeClock()
    async with BackendScraper(sim.url, kind="vllm", clock=clock, timeout_s=2.0) as scraper:
        ok = await scraper.scrape()
        assert ok.error is None and ok.taken_at == 100.0 and ok.kv_capacity_tokens
        sim.stop()
        clock.now = 107.0
        failed = await scraper.scrape()
        assert failed.error is not None and "/metrics" in failed.error
        assert failed.healthy is False
        assert failed.taken_at == 100.0 and failed.kv_capacity_tokens == ok.kv_capacity_tokens
        assert failed.age(clock.now) == 7.0 and failed.is_stale(clock.now, max_age_s=5.0)
        assert scraper.latest is failed


@pytest.mark.parametrize("kind", ["auto", "vllm", "llamacpp", "openai"])
async def test_nothing_listening_is_an_error_not_an_exception(kind) -> None:
    async with BackendScraper(f"http://127.0.0.1:{free_port()}", kind=kind, timeout_s=2.0) as scraper:
        snap = await scraper.scrape()
    assert snap.error and snap.taken_at is None and snap.healthy is False
    assert snap.age(1.0) is None
