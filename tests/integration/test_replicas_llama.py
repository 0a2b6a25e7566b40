"""Three gateway processes, sharing their demand and limits through a real ``redis-server``, in front of
one real llama-server with more clients than slots: the limits they hold together stay at or below the
slots, each holds its fair part, and no request fails.

Each gateway reads the slot count (its hard cap) from llama-server's ``/props``; alone, each would hold
all the slots and the server would queue the rest itself. With the others' demand known, each holds its
demand-weighted part of the cap, rounded down (``gateway.control.share.cap_share``). The controllers
tick fast (``FAST``, as in ``test_controller_llama.py``) so the run is short.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from gateway.sweep.client import StreamClient, Target
from gateway.sweep.loadgen import ClosedLoopPool
from gateway.sweep.workload import RequestFactory, Workload, parse_length
from tests.support.gateway import get_json, start_gateway
from tests.support.llama import MODEL, llama_config, start_llama_server
from tests.support.redis_server import start_redis

SLOTS = 6
GATEWAYS = 3
CLIENTS = 6  # per gateway: 18 clients for 6 slots
RUN_S = 20.0
SETTLED_AFTER_S = 6.0
FAST = {
    "SWEETSPOT_CONTROL_INTERVAL_S": "0.5", "SWEETSPOT_SETTLE_S": "1", "SWEETSPOT_MEASURE_S": "2",
    "SWEETSPOT_WINDOW_S": "5", "SWEETSPOT_REPROBE_S": "10", "SWEETSPOT_METRICS_INTERVAL_S": "0.5",
}
WORKLOAD = Workload(api="completions", prompt_len=parse_length(16), output_len=parse_length(32))


def limit_of(gateway: str) -> int:
    return int(get_json(f"{gateway}/state")["upstreams"][0]["limit"])


async def load_all(gateways: list[str], seconds: float) -> tuple[list[list[tuple[float, int]]], int, int]:
    """CLIENTS closed-loop streaming clients on each gateway; every gateway's limit sampled each 0.25 s."""
    clients = [StreamClient(Target(url, api="completions", model=MODEL)) for url in gateways]
    samples: list[list[tuple[float, int]]] = [[] for _ in gateways]
    for client in clients:
        await client.__aenter__()
    pools = [ClosedLoopPool(client, RequestFactory(WORKLOAD), concurrency=CLIENTS) for client in clients]
    try:
        for pool in pools:
            pool.start()
        t0 = time.perf_counter()
        while (now := time.perf_counter()) - t0 < seconds:
            limits = await asyncio.gather(*(asyncio.to_thread(limit_of, url) for url in gateways))
            for g, limit in enumerate(limits):
                samples[g].append((now - t0, limit))
            await asyncio.sleep(0.25)
        stats = [pool.stats() for pool in pools]
    finally:
        for pool in pools:
            await pool.stop(drain_timeout_s=0)
        for client in clients:
            await client.__aexit__(None, None, None)
    return samples, sum(s.failed + s.rejected for s in stats), sum(s.completed for s in stats)


async def test_three_gateways_share_the_slots_of_one_llama_server(processes) -> None:
    _, redis_url = start_redis(processes)
    llama = start_llama_server(processes, llama_config(parallel=SLOTS, threads=1)).url
    env = {**FAST, "SWEETSPOT_SHARE_REDIS_URL": redis_url}
    gateways = [start_gateway(processes, [llama], env=env).url for _ in range(GATEWAYS)]
    samples, failed, completed = await load_all(gateways, RUN_S)

    settled = [[limit for t, limit in series if t >= SETTLED_AFTER_S] for series in samples]
    sums = [sum(limits) for limits in zip(*settled)]
    medians = [statistics.median(limits) for limits in settled]
    share = SLOTS / GATEWAYS
    report = f"limits over time {samples}; summed after {SETTLED_AFTER_S} s {sums}; medians {medians}"
    print(report)
    assert completed > 0 and failed == 0, f"{failed} failed of {completed}; {report}"
    assert max(sums) <= SLOTS, report
    assert all(abs(median - share) <= 0.25 * share for median in medians), report
