"""The controller in the running gateway, in front of a real vLLM whose KV budget preempts, against static limits
measured in the same test, under closed-loop loads of three times the concurrency the KV cache holds, streamed
and not streamed.

The setting is the curve of ``docs/vllm-curve.md``: vLLM on the generated 8-layer, 1024-wide Llama (a decode
step reads every weight once for the whole batch, so batching pays on a CPU until the batch's attention and
the KV budget catch up) with ``--num-gpu-blocks-override 128``: a request of this workload (32 prompt + 200 output tokens) takes 8
blocks of 32 tokens, and vLLM holds one block back, so C = 15 fit at once. Above C vLLM admits more than fit, runs out of blocks as
they grow and preempts (drops a request's KV and recomputes it later). A static limit of 2C shows that in the
same test (``vllm:num_preemptions_total`` rises while it runs). Asked of the controller, given 3C clients: it
settles at or below C, sees at most one preemption a minute while measured, and delivers at least 0.9 x the
output throughput of the best static limit (C/2, C or 2C), compared round by round in rotated rounds
(``tests/support/closed_loop.py``). What keeps it at or below C is the gateway's hard cap for vLLM: the KV
budget from ``vllm:cache_config_info`` over the recent requests' footprint (prompt + output tokens); where it
sits below that is the knee its throughput readings find.

Throughput is vLLM's own count (``vllm:generation_tokens_total``, which moves with every engine step, streamed
or not) over each run's measured window: every configuration runs against the same server, one at a time, so
the counter's delta is that configuration's. Whole answers show their tokens to the gateway only at their end;
the controller meters them from the same vLLM counter, attributed to its own share of vLLM's running requests
(``gateway/control/accounting.py``).
"""

from __future__ import annotations

import asyncio
import math
import time
from functools import partial

import pytest

from gateway.sweep.workload import Workload, parse_length
from tests.support.closed_loop import (
    Objectives, limit_of, rotated_rounds, start_configurations, stream_load, upstream_state, whole_load,
)
from tests.support.gateway import metric_value
from tests.support.vllm import KNEE, MODEL, start_vllm, vllm_config

BLOCK = 32
KV_BLOCKS = 128
PROMPT_TOKENS = 32
OUTPUT_TOKENS = 200
# vLLM gives each request whole blocks (8 of 32 tokens here) from all but one of its blocks (its null block).
C = (KV_BLOCKS - 1) // math.ceil((PROMPT_TOKENS + OUTPUT_TOKENS) / BLOCK)  # 15 requests fit
CLIENTS = 3 * C
STATIC_LIMITS = (C // 2, C, 2 * C)
ROUNDS = 3
WARMUP_S = 4.0  # per run: a request lasts about 4 s at C; the first wave's prefills pass
MEASURE_S = 12.0
CONVERGE_S = 40.0
WORKLOAD = Workload(api="completions", prompt_len=parse_length(PROMPT_TOKENS), output_len=parse_length(OUTPUT_TOKENS))


@pytest.fixture(scope="module")
def vllm_url(module_processes) -> str:
    config = vllm_config(KNEE, max_num_seqs=64, num_gpu_blocks=KV_BLOCKS, max_model_len=1024, block_size=BLOCK)
    start_vllm(module_processes, config, timeout=600)
    return config.base_url


def vllm_counter(url: str, name: str) -> float:
    value = metric_value(f"{url}/metrics", name)
    assert value is not None, f"vLLM's /metrics has no {name}"
    return value


async def idle(url: str, timeout: float = 30.0) -> None:
    """Wait until vLLM runs and queues nothing: the clients of the previous run hung up, but vLLM ends their
    requests a few seconds later, and until then they hold KV blocks (and preempt) under the next run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = [await asyncio.to_thread(vllm_counter, url, name)
                for name in ("vllm:num_requests_running", "vllm:num_requests_waiting")]
        if not any(busy):
            await asyncio.sleep(1.0)  # a scrape and a tick: the gateways read the counters as they stand now
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"vLLM still busy {timeout} s after the clients hung up")


def changes(state: dict) -> list[str]:
    """The controller's limit changes, each with its reason and the signals behind it."""
    return [f"{d['previous']}->{d['limit']} {d['reason']} {d['inputs'].get('signals', '')} kv={d['inputs'].get('kv_usage')} "
            f"running={d['inputs'].get('backend_running')} preempted={d['inputs'].get('preemptions_total')}"
            for d in state["controller"].get("decisions", []) if d["limit"] != d["previous"]]


async def compare(module_processes, vllm_url: str, load, *, by_goodput: bool) -> None:
    """Converge the controller under ``load``, then rotated rounds of every configuration; assert the issue's bar,
    on goodput (``by_goodput``) or on throughput."""
    gateways = start_configurations(module_processes, vllm_url, STATIC_LIMITS)
    controller = gateways["controller"]
    config = upstream_state(controller)["controller"]["config"]
    objectives = Objectives(ttft_s=config["ttft_p99_slo_s"], tpot_s=config["tpot_p99_slo_s"])
    if by_goodput:
        load = partial(load, objectives=objectives)
    generated = partial(vllm_counter, vllm_url, "vllm:generation_tokens_total")
    preempted = partial(vllm_counter, vllm_url, "vllm:num_preemptions_total")
    converging: list[int] = []
    await idle(vllm_url)
    await load(controller, seconds=CONVERGE_S, warmup_s=0.0, on_tick=lambda: converging.append(limit_of(controller)),
               tokens=generated)
    converged_at = limit_of(controller)
    settled: list[int] = []
    preemptions: dict[str, float] = {name: 0.0 for name in gateways}
    throughput: dict[str, list[float]] = {name: [] for name in gateways}

    async def run(name: str) -> float:
        watch = (lambda: settled.append(limit_of(controller))) if name == "controller" else None
        await idle(vllm_url)
        before = preempted()
        result = await load(gateways[name], seconds=MEASURE_S, warmup_s=WARMUP_S, on_tick=watch, tokens=generated)
        preemptions[name] += preempted() - before
        throughput[name].append(round(result.tokens_per_s))
        return result.goodput_per_s if by_goodput else result.tokens_per_s

    comparison = await rotated_rounds(list(gateways), ROUNDS, run)
    state = upstream_state(controller)
    algorithm = state["controller"]["algorithm"]
    cap = metric_value(f"{controller}/metrics", "sweetspot_limit_hard_cap")
    report = (f"C={C}; hard cap {cap}; limit while converging {converging}, at the end {converged_at}, while "
              f"measured {settled}; metered by {algorithm.get('tokens_source')}; preemptions per configuration "
              f"(warm-ups included) {preemptions}; compared on {'goodput' if by_goodput else 'throughput'} "
              f"({objectives}): {comparison.report()}; throughput per run {throughput}; curve "
              f"{algorithm.get('curve')}; changes {changes(state)}")
    print(report)

    assert preemptions[f"static {2 * C}"] > 0, f"a static limit of {2 * C} should make vLLM preempt: {report}"
    assert settled and max(settled) <= C, report
    assert converged_at <= C, report
    assert preemptions["controller"] <= math.ceil(ROUNDS * (MEASURE_S + WARMUP_S) / 60), report
    assert comparison.paired[comparison.best_static] >= 0.9, report


@pytest.mark.timeout(900)  # vLLM's start (about a minute) is part of the first test's setup
async def test_controller_settles_under_the_kv_budget_with_streams(module_processes, vllm_url) -> None:
    await compare(module_processes, vllm_url, partial(stream_load, model=MODEL, workload=WORKLOAD, clients=CLIENTS),
                  by_goodput=True)


@pytest.mark.timeout(600)
async def test_controller_settles_under_the_kv_budget_with_whole_answers(module_processes, vllm_url) -> None:
    await compare(module_processes, vllm_url, partial(whole_load, model=MODEL, workload=WORKLOAD, clients=CLIENTS),
                  by_goodput=False)
