"""The controller in the running gateway, in front of a real vLLM whose KV budget preempts: against static limits
measured in the same test, under a closed-loop load of three times the concurrency the KV cache holds.

The setting: vLLM on the generated 8-layer, 1024-wide Llama (weights read once per decode step for the whole
batch, so batching pays on a CPU) with ``--num-gpu-blocks-override`` so small that about C requests of this
workload fit at once, where C = blocks // blocks per request. Above C vLLM admits more than fit, runs out of
blocks as they grow and preempts (drops a request's KV and recomputes it later). The test shows that with a
static limit of 2C (vLLM's ``vllm:num_preemptions_total`` rises during its runs), and asks of the controller,
given 3C clients: it settles at or below C, sees at most one preemption a minute once settled, and delivers at
least 0.9x the output throughput of the best static limit (below C or above it), compared round by round in
rotated rounds as ``test_controller_llama.py`` does (the median of the per-round ratios).

Throughput is vLLM's own count (``vllm:generation_tokens_total``) over each run's measured window: every
configuration runs against the same server, one at a time, so the counter's delta is that configuration's.
What stops the controller at C is the gateway's hard cap: the KV budget from ``vllm:cache_config_info`` divided
by the recent requests' footprint (prompt + output tokens). The controller's faster settings are the llama
test's (ticks every 0.5 s, 1 s to settle, 2 s readings).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.bench import ClosedLoopPool, RequestFactory, StreamClient, Target, Workload, parse_length
from tests.support.gateway import get_json, metric_value, start_gateway
from tests.support.vllm import KNEE, MODEL, start_vllm, vllm_config

BLOCK = 32
PROMPT_WORDS = 200  # long prompts: a preempted request's recompute costs a real prefill
OUTPUT_TOKENS = 56
BLOCKS_PER_REQUEST = 9  # prompt (~200-230 tokens) + 56 output tokens <= 288
KV_BLOCKS = 6 * BLOCKS_PER_REQUEST + 1  # vLLM keeps one block aside (its null block)
C = (KV_BLOCKS - 1) // BLOCKS_PER_REQUEST  # 6 requests fit even at their full length
CLIENTS = 3 * C
STATIC_LIMITS = (C // 2, 2 * C)  # below C, and above it (vLLM preempts)
ROUNDS = 3
WARMUP_S = 3.0
MEASURE_S = 15.0
CONVERGE_S = 30.0
FAST = {
    "SWEETSPOT_CONTROL_INTERVAL_S": "0.5", "SWEETSPOT_SETTLE_S": "1", "SWEETSPOT_MEASURE_S": "2",
    "SWEETSPOT_WINDOW_S": "5", "SWEETSPOT_REPROBE_S": "10", "SWEETSPOT_METRICS_INTERVAL_S": "0.5",
    # Latency objectives out of the way: a 200-token prefill stalls every stream's next token for a moment on
    # one CPU thread, and what is under test here is the KV/preemption signal, not the latency one.
    "SWEETSPOT_TTFT_P99_SLO_S": "120", "SWEETSPOT_TPOT_P99_SLO_S": "30",
}
WORKLOAD = Workload(api="completions", prompt_len=parse_length(PROMPT_WORDS), output_len=parse_length(OUTPUT_TOKENS))


@pytest.fixture(scope="module")
def vllm_url(module_processes) -> str:
    config = vllm_config(KNEE, max_num_seqs=64, num_gpu_blocks=KV_BLOCKS, max_model_len=1024, block_size=BLOCK)
    start_vllm(module_processes, config, timeout=600)
    return config.base_url


@pytest.fixture(scope="module")
def gateways(module_processes, vllm_url) -> dict[str, str]:
    configs: dict[str, tuple[str, ...]] = {"controller": ("--initial-limit", str(C))}
    configs |= {f"static {k}": ("--no-control", "--initial-limit", str(k)) for k in STATIC_LIMITS}
    with ThreadPoolExecutor(len(configs)) as pool:
        started = {name: pool.submit(start_gateway, module_processes, [vllm_url], *args, env=FAST)
                   for name, args in configs.items()}
        return {name: future.result().url for name, future in started.items()}


def limit_of(gateway: str) -> int:
    return int(get_json(f"{gateway}/state")["upstreams"][0]["limit"])


def cap_of(gateway: str) -> float:
    return metric_value(f"{gateway}/metrics", "sweetspot_limit_hard_cap") or 0.0


def vllm_counter(url: str, name: str) -> float:
    value = metric_value(f"{url}/metrics", name)
    assert value is not None, f"vLLM's /metrics has no {name}"
    return value


async def run_load(gateway: str, vllm_url: str, seconds: float, *, warmup_s: float = WARMUP_S,
                   on_tick=None) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """CLIENTS closed-loop streaming clients for ``warmup_s + seconds``: (output tokens/s by vLLM's counter,
    preemptions) over the measured part."""
    async with StreamClient(Target(gateway, api="completions", model=MODEL)) as client:
        pool = ClosedLoopPool(client, RequestFactory(WORKLOAD), concurrency=CLIENTS)
        pool.start()
        try:
            await asyncio.sleep(warmup_s)
            t0 = time.perf_counter()
            tokens0 = await asyncio.to_thread(vllm_counter, vllm_url, "vllm:generation_tokens_total")
            preempted0 = await asyncio.to_thread(vllm_counter, vllm_url, "vllm:num_preemptions_total")
            deadline = t0 + seconds
            while (now := time.perf_counter()) < deadline:
                if on_tick is not None:
                    await asyncio.to_thread(on_tick)
                await asyncio.sleep(min(0.5, deadline - now))
            tokens1 = await asyncio.to_thread(vllm_counter, vllm_url, "vllm:generation_tokens_total")
            preempted1 = await asyncio.to_thread(vllm_counter, vllm_url, "vllm:num_preemptions_total")
            t1 = time.perf_counter()
            stats = pool.stats()
        finally:
            await pool.stop(drain_timeout_s=0)
    assert stats.failed == 0, f"{stats.failed} requests failed through {gateway}"
    return (tokens1 - tokens0) / (t1 - t0), preempted1 - preempted0


@pytest.mark.timeout(600)  # vLLM's start (about a minute) is part of the first test's setup
async def test_controller_settles_at_or_below_the_kv_budget_without_preempting(gateways, vllm_url) -> None:
    controller = gateways["controller"]
    limits: list[int] = []
    await run_load(controller, vllm_url, CONVERGE_S, warmup_s=0.0, on_tick=lambda: limits.append(limit_of(controller)))
    converged_at = limit_of(controller)
    settled: list[int] = []
    caps: list[float] = []

    runs: dict[str, list[float]] = {name: [] for name in gateways}
    preemptions: dict[str, float] = {name: 0.0 for name in gateways}
    order = list(gateways)
    for round_index in range(ROUNDS):
        rotated = order[round_index % len(order):] + order[:round_index % len(order)]
        for name in rotated:
            watch = (lambda: settled.append(limit_of(controller)) or caps.append(cap_of(controller))) \
                if name == "controller" else None
            tokens_per_s, preempted = await run_load(gateways[name], vllm_url, MEASURE_S, on_tick=watch)
            runs[name].append(tokens_per_s)
            preemptions[name] += preempted
    paired = {name: statistics.median(c / s for c, s in zip(runs["controller"], values))
              for name, values in runs.items() if name != "controller"}
    best_static = min(paired, key=paired.__getitem__)
    above = f"static {2 * C}"
    controller_minutes = ROUNDS * MEASURE_S / 60
    decisions = get_json(f"{controller}/state")["upstreams"][0].get("controller", {})
    report = (f"C={C}; hard caps seen {sorted(set(caps))}; controller state {decisions}; limit while converging {limits}, at the end {converged_at}, while measured "
              f"{settled}; tokens/s per run {({n: [round(v) for v in vs] for n, vs in runs.items()})}; preemptions "
              f"while measured {preemptions}; controller / static, median of the rounds "
              f"{({n: round(r, 3) for n, r in paired.items()})}; best static: {best_static}")
    print(report)

    assert preemptions[above] > 0, f"a static limit of {2 * C} should make vLLM preempt: {report}"
    assert settled and max(settled) <= C, report
    assert converged_at <= C, report
    assert preemptions["controller"] <= math.ceil(controller_minutes), report
    assert paired[best_static] >= 0.9, report
