"""Three gateway processes, sharing their demand and limits through a real ``redis-server``, in front of
one real llama-server with twice as many clients as slots: the limits they hold together stay at or below
the slots, each holds its demand-weighted part of what they hold together, and no request fails.

Each gateway reads the slot count (its hard cap) from llama-server's ``/props``; alone, each would hold
all the slots and the server would queue the rest itself. With the others' demand known, each holds its
demand-weighted part of the cap, rounded down (``gateway.control.share.cap_share``), and of the limits
all of them hold: the lowest-id gateway whose limit binds searches, the others follow its limit scaled
by demand (``gateway.control.share.follow_target``).

What the numbers are chosen for:

* The share is judged against the *summed* limit, not the slots: where the sum settles is each
  controller's own knee search (``test_controller_llama.py`` tests that part), and how it is split is
  what this test is about. Shares of 4 (12 slots, 3 gateways) leave room for the 25% bound to mean
  something: with shares of 2, anything but exactly 2 each broke it, and one exploratory step to 1
  slot turned a median into a failure.
* Uneven demand (12, 6 and 6 clients): the split to check is 2:1:1, which no arrival order and no
  even split gives; the gateways learn it only from the demand they publish in Redis.
* llama-server runs one thread, as in ``test_controller_llama.py`` (two threads on two shared cores stall
  on each other's work), with 12 slots; answers of 32 tokens keep every request short, so a share
  moves within a few of the controllers' fast ticks (``FAST_CONTROL``).
"""

from __future__ import annotations

import asyncio
import statistics
import time

from gateway.sweep.client import StreamClient, Target
from gateway.sweep.loadgen import ClosedLoopPool
from gateway.sweep.workload import RequestFactory, Workload, parse_length
from testbed.closed_loop import FAST_CONTROL
from testbed.gateway import get_json, start_gateway
from testbed.llama import MODEL, llama_config, start_llama_server
from testbed.redis_server import start_redis

SLOTS = 12
CLIENTS = (12, 6, 6)  # per gateway: 24 clients for 12 slots, demand 2:1:1
FAIR_SHARE = 0.25  # the bound, as the scenario harness's ``fair`` check
RUN_S = 24.0
SETTLED_AFTER_S = 8.0
WORKLOAD = Workload(api="completions", prompt_len=parse_length(16), output_len=parse_length(32))


def limit_of(gateway: str) -> int:
    return int(get_json(f"{gateway}/state")["upstreams"][0]["limit"])


async def load_all(gateways: list[str], seconds: float) -> tuple[list[list[tuple[float, int]]], int, int]:
    """``CLIENTS`` closed-loop streaming clients on the gateways; every gateway's limit sampled each 0.25 s."""
    clients = [StreamClient(Target(url, api="completions", model=MODEL)) for url in gateways]
    samples: list[list[tuple[float, int]]] = [[] for _ in gateways]
    for client in clients:
        await client.__aenter__()
    pools = [
        ClosedLoopPool(client, RequestFactory(WORKLOAD), concurrency=n)
        for client, n in zip(clients, CLIENTS, strict=True)
    ]
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


def unfair(medians: list[float]) -> list[str]:
    """Gateways whose median is not within ``FAIR_SHARE`` of their demand-weighted share of the summed medians."""
    total = sum(medians)
    shares = [total * n / sum(CLIENTS) for n in CLIENTS]
    return [
        f"gateway {g}: {median} against a share of {share:.2f}"
        for g, (median, share) in enumerate(zip(medians, shares, strict=True))
        if abs(median - share) > FAIR_SHARE * share
    ]


def test_the_share_check_can_fail() -> None:
    """The bound on the split catches what the gateways would do without the others' demand: an even
    split (4 + 4 + 4) of the same sum, or one gateway holding the room the others left."""
    assert unfair([4, 4, 4]) and unfair([8, 2, 2])
    assert not unfair([6, 3, 3]) and not unfair([5, 3, 3])


async def test_three_gateways_share_the_slots_of_one_llama_server(processes) -> None:
    _, redis_url = start_redis(processes)
    llama = start_llama_server(processes, llama_config(parallel=SLOTS, threads=1)).url
    env = {**FAST_CONTROL, "SWEETSPOT_SHARE_REDIS_URL": redis_url}
    gateways = [start_gateway(processes, [llama], env=env).url for _ in CLIENTS]
    samples, failed, completed = await load_all(gateways, RUN_S)

    settled = [[limit for t, limit in series if t >= SETTLED_AFTER_S] for series in samples]
    sums = [sum(limits) for limits in zip(*settled, strict=True)]
    medians = [statistics.median(limits) for limits in settled]
    report = f"limits over time {samples}; summed after {SETTLED_AFTER_S} s {sums}; medians {medians}"
    print(report)
    assert completed > 0 and failed == 0, f"{failed} failed of {completed}; {report}"
    assert max(sums) <= SLOTS, report
    assert not unfair(medians), f"{unfair(medians)}; {report}"
