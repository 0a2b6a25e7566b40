"""LoRA affinity through the gateway, in front of two simulated vLLM upstreams serving the same two adapters.

The simulators run in this process under uvicorn on loopback sockets (``gateway.sim``, LoRA enabled, one adapter
per batch: ``max_loras`` 1), the gateway reads their ``vllm:lora_requests_info`` through its backend scrape and
their adapters from their model lists. With an adapter running on one upstream, a request for the other adapter
goes to the other upstream (there, it would wait for the first to drain: a swap) and more requests for the first
adapter join it where it runs, though by load alone the last would go to the other upstream and wait there.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from gateway.sim.engine import Engine
from gateway.sim.http_app import SimConfig, create_sim_app
from gateway.sim.lora import LoraConfig
from gateway.sim.profiles import LLAMA31_8B_24GB
from tests.component.conftest import BOUND_S, Exchange, GatewayUnderTest, Stage, until

ADAPTERS = (("sql", "/adapters/sql"), ("chat", "/adapters/chat"))


@asynccontextmanager
async def sim_server(config: SimConfig) -> AsyncIterator[tuple[str, FastAPI]]:
    """A simulator served by uvicorn on a loopback port of its own; its URL and app (``app.state.engine``)."""
    app = create_sim_app(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(BOUND_S):
            while not server.started:
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app
    finally:
        server.should_exit = True
        await task
        sock.close()


def stream_for(gw: GatewayUnderTest, model: str) -> Exchange:
    """A stream long enough (about 25 s of tokens) to be running through the test; the test hangs up on it."""
    return gw.chat(stream=True, model=model, max_tokens=2000, ignore_eos=True)


async def test_adapters_go_where_they_run_and_away_from_a_swap(stage: Stage) -> None:
    lora = LoraConfig(ADAPTERS, max_loras=1, max_cpu_loras=2)
    config = SimConfig(LLAMA31_8B_24GB, model_name="base", lora=lora)
    async with sim_server(config) as (url_1, app_1), sim_server(config) as (url_2, app_2):
        engines: dict[str, Engine] = {url_1: app_1.state.engine, url_2: app_2.state.engine}
        gw = await stage.gateway(url_1, url_2, routing="prefix", metrics_interval_s=0.05)
        pool = gw.parts.pool
        assert pool.is_adapter("sql") and pool.is_adapter("chat") and not pool.is_adapter("base")
        await until(lambda: all(u.lora is not None and u.lora.max_lora == 1 for u in pool))

        # each stream's first chunk (the role) comes before its engine schedules it: wait for the engines
        first = stream_for(gw, "sql")
        await until(lambda: sum(engine.num_running for engine in engines.values()) == 1)
        sql_on = next(url for url, engine in engines.items() if engine.running_adapters() == ["sql"])
        chat_on = next(url for url in engines if url != sql_on)
        other = stream_for(gw, "chat")
        await until(lambda: engines[chat_on].num_running == 1)
        again = stream_for(gw, "sql")
        await until(lambda: engines[sql_on].num_running == 2)
        third = stream_for(gw, "sql")  # by load alone it would go where chat runs (3 free there, 2 here)
        await until(lambda: engines[sql_on].num_running == 3)
        assert engines[sql_on].running_adapters() == ["sql"] and engines[chat_on].running_adapters() == ["chat"]
        assert all(engine.num_waiting == 0 for engine in engines.values())  # nobody waits for an adapter slot
        # the scrape sees what runs (vllm:lora_requests_info, every metrics_interval_s)
        await until(lambda: pool.by_name[sql_on].lora.running == ("sql",))  # type: ignore[union-attr]

        placed = {p: gw.metric("sweetspot_routing_adapter_decisions_total", placement=p) for p in ("cold", "running")}
        assert placed == {"cold": 2.0, "running": 2.0}
        assert gw.metric("sweetspot_routing_adapter_decisions_total", placement="swap") == 0.0
        streams = (first, other, again, third)
        for exchange in streams:
            await exchange.wait_for(b'"content"')
        assert [ex.status for ex in streams] == [200] * 4
        assert [ex.events()[0]["model"] for ex in streams] == ["sql", "chat", "sql", "sql"]

        for exchange in streams:
            exchange.hang_up()  # the simulators abort them, as vLLM does
            await exchange.done()
        await until(lambda: all(engine.num_running == 0 for engine in engines.values()))
        await until(lambda: all(u.lora is not None and not u.lora.running for u in pool))  # scraped idle again
        assert all(not gw.parts.router.adapters.ledger.inflight(u.name) for u in pool)  # type: ignore[union-attr]
        gw.assert_settled()
