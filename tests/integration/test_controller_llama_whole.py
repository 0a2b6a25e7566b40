"""The controller in the running gateway, in front of a real llama-server, when nobody streams: closed-loop
clients at three times the knee (the server's 4 slots) ask for whole answers, and the controller must deliver
at least 0.9 x the throughput of the best static limit measured in the same test.

A whole answer shows its tokens to the gateway only when it ends, and llama-server's own token counter moves
only then too, so the controller meters them itself: each answer's tokens spread over its life, a reading final
once every request that ran in it has ended (``gateway/control/accounting.py``, ``meter.py``). Without that, a
reading holds whichever answers happened to end in it.

The method is ``test_controller_llama.py``'s (read its notes): one gateway per configuration in front of the
same one-thread server, short runs in an order that rotates each round, the controller compared with each
static limit round by round, the median of those ratios. What differs is how a run is measured: the client
side has the same problem as the controller, so a run counts each answer's tokens spread evenly over its life
(from sending to its end) inside the measured interval, and lets the answers still in flight at the end finish
to know their counts. Spread that way over any interval of a steady load, the count is unbiased.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest

from gateway.sweep.workload import RequestFactory, Workload, parse_length
from tests.support.gateway import get_json, start_gateway
from tests.support.llama import FAST_CONTROL, MODEL, llama_config, start_llama_server

SLOTS = 4
CLIENTS = 3 * SLOTS
STATIC_LIMITS = (2, 4, 8)  # below, at and above the slot count
ROUNDS = 7
WARMUP_S = 1.0
MEASURE_S = 3.0
CONVERGE_S = 10.0
WORKLOAD = Workload(api="completions", prompt_len=parse_length(16), output_len=parse_length(64))


@pytest.fixture(scope="module")
def gateways(module_processes) -> dict[str, str]:
    llama = start_llama_server(module_processes, llama_config(parallel=SLOTS, threads=1)).url
    configs: dict[str, tuple[str, ...]] = {"controller": ()}
    configs |= {f"static {k}": ("--no-control", "--initial-limit", str(k)) for k in STATIC_LIMITS}
    with ThreadPoolExecutor(len(configs)) as pool:
        started = {name: pool.submit(start_gateway, module_processes, [llama], *args, env=FAST_CONTROL)
                   for name, args in configs.items()}
        return {name: future.result().url for name, future in started.items()}


def upstream_state(gateway: str) -> dict:
    return get_json(f"{gateway}/state")["upstreams"][0]


def spread(answers: list[tuple[float, float, int]], begin: float, end: float) -> float:
    """Tokens inside ``[begin, end]``, each answer's spread evenly over its life."""
    total = 0.0
    for start, finish, tokens in answers:
        if finish <= start:
            continue
        total += tokens * max(0.0, min(finish, end) - max(start, begin)) / (finish - start)
    return total


async def run_whole(gateway: str, seconds: float, *, warmup_s: float = WARMUP_S, on_tick=None) -> float:  # type: ignore[no-untyped-def]
    """CLIENTS closed-loop clients asking for whole answers for ``warmup_s + seconds``; output tokens/s inside
    the measured interval, each answer spread over its life."""
    factory = RequestFactory(WORKLOAD)
    answers: list[tuple[float, float, int]] = []
    failures: list[str] = []
    stopping = asyncio.Event()
    url = f"{gateway}/v1/completions"

    async def client(session: aiohttp.ClientSession) -> None:
        while not stopping.is_set():
            body = dict(factory.next().body, model=MODEL, stream=False)
            body.pop("stream_options", None)
            start = time.perf_counter()
            async with session.post(url, json=body) as resp:
                payload = await resp.json(content_type=None)
            if resp.status != 200:
                failures.append(f"HTTP {resp.status}: {payload}")
                continue
            answers.append((start, time.perf_counter(), int(payload["usage"]["completion_tokens"])))

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(CLIENTS)]
        try:
            await asyncio.sleep(warmup_s)
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while (now := time.perf_counter()) < deadline:
                if on_tick is not None:
                    on_tick()
                await asyncio.sleep(min(0.5, deadline - now))
            t1 = time.perf_counter()
            stopping.set()
            await asyncio.gather(*tasks)  # the answers in flight at t1 finish: their counts are needed
        finally:
            for task in tasks:
                task.cancel()
    assert not failures, f"{len(failures)} requests failed through {gateway}: {failures[:3]}"
    return spread(answers, t0, t1) / (t1 - t0)


async def test_controller_holds_whole_answers_at_the_best_static_throughput(gateways) -> None:
    controller = gateways["controller"]
    limits: list[int] = []

    def watch() -> None:
        limits.append(int(upstream_state(controller)["limit"]))

    await run_whole(controller, CONVERGE_S, warmup_s=0.0, on_tick=watch)
    state = upstream_state(controller)
    converged_at = int(state["limit"])
    algorithm = state["controller"]["algorithm"]
    settled: list[int] = []

    def watch_settled() -> None:
        settled.append(int(upstream_state(controller)["limit"]))

    runs: dict[str, list[float]] = {name: [] for name in gateways}
    order = list(gateways)
    for round_index in range(ROUNDS):
        rotated = order[round_index % len(order):] + order[:round_index % len(order)]
        for name in rotated:
            runs[name].append(await run_whole(gateways[name], MEASURE_S,
                                              on_tick=watch_settled if name == "controller" else None))
    medians = {name: statistics.median(values) for name, values in runs.items()}
    paired = {name: statistics.median(c / s for c, s in zip(runs["controller"], values))
              for name, values in runs.items() if name != "controller"}
    best_static = min(paired, key=paired.__getitem__)
    curve = upstream_state(controller)["controller"]["algorithm"]["curve"]
    report = (f"limit while converging {limits}, at the end {converged_at} (metered by "
              f"{algorithm['tokens_source']}), while measured {settled}; curve {curve}; tokens/s per run "
              f"{({n: [round(v) for v in vs] for n, vs in runs.items()})}; medians "
              f"{({n: round(v) for n, v in medians.items()})}; controller / static, median of the rounds "
              f"{({n: round(r, 3) for n, r in paired.items()})}; best static: {best_static}")
    print(report)

    assert algorithm["tokens_source"] == "gateway", report  # llama-server's counter moves only as requests end
    assert algorithm["exact_throughput"], report
    assert paired[best_static] >= 0.9, report
