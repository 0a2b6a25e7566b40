"""Prefix-aware routing against least-loaded and random, side by side in one run, on simulated upstreams.

    .venv/bin/python -m bench.routing                      # 4 simulators, both workloads, all three policies
    .venv/bin/python -m bench.routing --duration 30 --json /tmp/routing.json
    .venv/bin/python -m bench.routing --quick              # a smoke run, in seconds

Upstreams: ``--upstreams`` simulators (``sweetspot sim``, vLLM's scheduler with automatic prefix caching, the
default profile, context raised to 16K), started once. For each workload and policy a gateway is started in
front of all of them with ``--routing POLICY`` and a fixed limit per upstream (``--no-control``, so only the
routing differs between runs), and ``--clients`` closed-loop clients stream through it:

* ``multi_turn``: each client holds a conversation (one of four shared system prompts of ~800 tokens, then
  6-14 turns of a 80-250 token user message and a 48-96 token reply, the whole history resent every turn,
  ``--think`` seconds between turns), then starts another;
* ``control``: every request is a fresh single-message prompt of 800-5,000 tokens that shares no prefix with
  any other, so no policy can gain from a cache.

Every run's texts carry a tag of their own at the start, so no run finds the previous run's prefixes cached.
Reported per run: TTFT p50/p99 (client side, first content chunk), output tokens/s, the simulators' true prefix
hit rate (``vllm:prefix_cache_hits / queries``), the gateway's estimate, and the requests each upstream served
(max / mean). Ratios are against least-loaded. The goal of issue #23: on multi_turn, TTFT p50 at least 1.5x lower
with prefix routing at the same throughput and no upstream above 1.25x the mean load; on control, within 3 %.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from dataclasses import dataclass, field

import aiohttp
from rich.console import Console
from rich.table import Table

from bench._quick import add_quick, parse
from bench._sims import (
    RunCounts,
    Window,
    add_load_args,
    add_round_args,
    client_session,
    deltas,
    labelled,
    median,
    pct,
    rotated,
    scrape,
    staggered,
    start_gateway,
    start_sims,
    stream_chat,
    words,
    write_json,
)
from gateway.common.processes import RunningProcess

console = Console(width=None if sys.stdout.isatty() else 160)
POLICIES = ("prefix", "least_loaded", "random")
WORKLOADS = ("multi_turn", "control")
#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py): the goal's workload, prefix
#: against least-loaded (the ratios' base), two simulators four times faster, a few clients for seconds.
QUICK = {
    "upstreams": 2,
    "clients": 4,
    "warmup": 1.0,
    "duration": 2.0,
    "time_scale": 4.0,
    "policies": ["prefix", "least_loaded"],
    "workloads": ["multi_turn"],
}


@dataclass
class Run(RunCounts):
    workload: str
    policy: str
    round: int = 0
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0  # output chunks received inside the measurement window
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    upstream_requests: list[float] = field(default_factory=list)
    sim_hit_rate: float = 0.0
    gateway_hit_estimate: float | None = None
    decisions: dict[str, float] = field(default_factory=dict)


async def multi_turn_client(
    session: aiohttp.ClientSession,
    url: str,
    rng: random.Random,
    systems: list[str],
    run: Run,
    window: Window,
    think_s: float,
) -> None:
    while time.monotonic() < window.end:
        messages = [{"role": "system", "content": rng.choice(systems)}]
        for _ in range(rng.randint(6, 14)):
            messages.append({"role": "user", "content": words(rng, rng.randint(80, 250))})
            reply = await stream_chat(session, url, "sim", messages, rng.randint(48, 96), run, window)
            if reply is None or time.monotonic() >= window.end:
                break
            messages.append({"role": "assistant", "content": reply})
            await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))


async def control_client(
    session: aiohttp.ClientSession,
    url: str,
    rng: random.Random,
    tag: str,
    client: int,
    run: Run,
    window: Window,
    think_s: float,
) -> None:
    i = 0
    while time.monotonic() < window.end:
        i += 1
        prompt = f"{tag} request {client}-{i}: " + words(rng, rng.randint(800, 5000))
        await stream_chat(session, url, "sim", [{"role": "user", "content": prompt}], rng.randint(48, 96), run, window)
        await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))


async def drive(workload: str, url: str, args: argparse.Namespace, run: Run, tag: str) -> None:
    t0 = time.monotonic()
    window = Window(t0 + args.warmup, t0 + args.warmup + args.duration)
    rng = random.Random(f"{args.seed}-{workload}")
    systems = [f"{tag} system prompt {k}: " + words(rng, 800) for k in range(4)]
    async with client_session() as session:
        clients = []
        for c in range(args.clients):
            crng = random.Random(f"{args.seed}-{workload}-{c}")
            if workload == "multi_turn":
                clients.append(multi_turn_client(session, url, crng, systems, run, window, args.think))
            else:
                clients.append(control_client(session, url, crng, tag, c, run, window, args.think))
        await staggered(clients, args.stagger)
    run.seconds = args.duration


def one_run(
    workload: str, policy: str, sims: list[RunningProcess], args: argparse.Namespace, tag: str, round_: int
) -> Run:
    gateway, url = start_gateway(policy, args.limit, sims, {"SWEETSPOT_ROUTING_LOAD_WEIGHT": str(args.load_weight)})
    run = Run(workload, policy, round_)
    try:
        before = [scrape(sim.url) for sim in sims]
        asyncio.run(drive(workload, url, args, run, tag))
        after = [scrape(sim.url) for sim in sims]
        gw = scrape(url)
    finally:
        gateway.stop()

    run.upstream_requests = deltas(after, before, "vllm:request_success_total")
    queries = sum(deltas(after, before, "vllm:prefix_cache_queries_total"))
    hits = sum(deltas(after, before, "vllm:prefix_cache_hits_total"))
    run.sim_hit_rate = hits / queries if queries else 0.0
    chunks = sum(labelled(gw, "sweetspot_routing_prefix_chunks_total").values())
    hit_chunks = sum(labelled(gw, "sweetspot_routing_prefix_hit_chunks_total").values())
    run.gateway_hit_estimate = hit_chunks / chunks if chunks else None
    run.decisions = labelled(gw, "sweetspot_routing_decisions_total")
    return run


def summary(runs: list[Run]) -> list[dict[str, object]]:
    """Per workload and policy, the median over rounds; ratios against least-loaded's medians."""
    rows: list[dict[str, object]] = []
    for workload in dict.fromkeys(r.workload for r in runs):
        base = [r for r in runs if r.workload == workload and r.policy == "least_loaded"]
        base_p50 = median([pct(r.ttft, 50) for r in base])
        base_tput = median([r.tokens_per_s for r in base])
        for policy in dict.fromkeys(r.policy for r in runs):
            mine = [r for r in runs if r.workload == workload and r.policy == policy]
            if not mine:
                continue
            p50 = median([pct(r.ttft, 50) for r in mine])
            tput = median([r.tokens_per_s for r in mine])
            rows.append(
                {
                    "workload": workload,
                    "policy": policy,
                    "rounds": len(mine),
                    "ttft_p50_ms": [round(pct(r.ttft, 50) * 1000) for r in mine],
                    "ttft_p50_median_ms": round(p50 * 1000),
                    "ttft_p99_median_ms": round(median([pct(r.ttft, 99) for r in mine]) * 1000),
                    "p50_gain": base_p50 / p50 if p50 else float("nan"),
                    "tokens_per_s_median": round(tput),
                    "tokens_per_s_ratio": tput / base_tput if base_tput else float("nan"),
                    "sim_hit_rate": median([r.sim_hit_rate for r in mine]),
                    "max_over_mean_load_worst": max(r.max_over_mean_load for r in mine),
                }
            )
    return rows


def report_summary(rows: list[dict[str, object]]) -> None:
    table = Table(title="medians over rounds (gain and ratio against least_loaded's medians)")
    for col in (
        "workload",
        "policy",
        "rounds",
        "TTFT p50 ms per round",
        "p50 median",
        "p99 median",
        "p50 gain",
        "out tok/s",
        "tok/s ratio",
        "sim hit rate",
        "load max/mean (worst)",
    ):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(
            str(row["workload"]),
            str(row["policy"]),
            str(row["rounds"]),
            " ".join(str(v) for v in row["ttft_p50_ms"]),  # type: ignore[attr-defined]
            str(row["ttft_p50_median_ms"]),
            str(row["ttft_p99_median_ms"]),
            f"{row['p50_gain']:.2f}x",
            str(row["tokens_per_s_median"]),
            f"{row['tokens_per_s_ratio']:.3f}",
            f"{row['sim_hit_rate']:.1%}",
            f"{row['max_over_mean_load_worst']:.2f}",
        )
    console.print(table)


def report(runs: list[Run]) -> None:
    table = Table(title="every run (ratios against least_loaded in the same round)")
    for col in (
        "round",
        "workload",
        "policy",
        "req",
        "err",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "p50 gain",
        "out tok/s",
        "tok/s ratio",
        "sim hit rate",
        "gw hit est.",
        "load max/mean",
        "requests per upstream",
    ):
        table.add_column(col, justify="right")
    base = {(r.round, r.workload): r for r in runs if r.policy == "least_loaded"}
    for r in runs:
        b = base.get((r.round, r.workload))
        p50 = pct(r.ttft, 50)
        gain = pct(b.ttft, 50) / p50 if b and p50 else float("nan")
        tput = r.tokens_per_s / b.tokens_per_s if b and b.tokens_per_s else float("nan")
        table.add_row(
            str(r.round),
            r.workload,
            r.policy,
            str(r.requests),
            str(r.errors),
            f"{p50 * 1000:.0f}",
            f"{pct(r.ttft, 99) * 1000:.0f}",
            f"{gain:.2f}x",
            f"{r.tokens_per_s:.0f}",
            f"{tput:.3f}",
            f"{r.sim_hit_rate:.1%}",
            "-" if r.gateway_hit_estimate is None else f"{r.gateway_hit_estimate:.1%}",
            f"{r.max_over_mean_load:.2f}",
            " ".join(f"{v:.0f}" for v in r.upstream_requests),
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstreams", type=int, default=4)
    add_load_args(
        parser,
        clients=(48, "closed-loop clients (conversations at a time)"),
        think=(0.5, "mean seconds between a reply and the next turn"),
        stagger=0.1,
        warmup=20.0,
        duration=40.0,
    )
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--load-weight", type=float, default=1.0, help="the gateway's routing_load_weight")
    add_round_args(parser)
    add_quick(parser, QUICK)
    args = parse(parser)

    sims: list[RunningProcess] = []
    runs: list[Run] = []
    try:
        sims = start_sims(args.upstreams, args.profile, args.time_scale, "sim", ["--max-model-len", "16384"])
        for round_ in range(args.rounds):
            for workload in args.workloads:
                for policy in rotated(args.policies, round_):
                    tag = f"run-{workload}-{policy}-{time.time_ns()}"
                    console.print(f"[bold]round {round_}: {workload} / {policy}[/] ...")
                    run = one_run(workload, policy, sims, args, tag, round_)
                    runs.append(run)
                    console.print(
                        f"  TTFT p50 {pct(run.ttft, 50) * 1000:.0f} ms, {run.tokens_per_s:.0f} tok/s, "
                        f"sim hit rate {run.sim_hit_rate:.1%}, decisions {run.decisions}"
                    )
    finally:
        for sim in sims:
            sim.stop()
    report(runs)
    rows = summary(runs)
    report_summary(rows)
    if args.json:
        write_json(args.json, args, rows, runs, ("tokens_per_s", "max_over_mean_load"))


if __name__ == "__main__":
    main()
