"""LoRA affinity against least-loaded routing, side by side in one run, on simulated multi-LoRA upstreams.

    .venv/bin/python -m bench.lora                         # 4 simulators, 12 adapters, both policies
    .venv/bin/python -m bench.lora --rounds 2 --json docs/lora.json
    .venv/bin/python -m bench.lora --quick                 # a smoke run, in seconds

Upstreams: ``--upstreams`` simulators (``sweetspot sim``, the default profile, LoRA enabled: ``--adapters``
adapters served by every one of them, ``--max-loras`` distinct adapters per batch, as many resident, a load
costing ``--lora-load-ms``; :mod:`gateway.sim.lora` says which of vLLM's rules that keeps). Every run starts
fresh simulators, so no policy inherits another's resident adapters. A gateway in front of them routes with
``--routing prefix`` (LoRA affinity on, at its default weights) or ``--routing least_loaded``, with a fixed
limit per upstream (``--no-control``, so only the routing differs), and ``--clients`` closed-loop clients stream
through it: each request names one adapter drawn from a Zipf distribution (``--zipf`` s, adapter k of N chosen
with probability proportional to 1/k^s), with a fresh prompt of 200-1,500 tokens (no prefix shared: the prefix
term of the score plays no part) and a 48-160 token reply, ``--think`` seconds between requests.

Reported per run, inside the measurement window after ``--warmup``: TTFT p50/p99 (client side, first content
chunk), output tokens/s, adapter loads per minute (the simulators' own ``sweetspot_sim_lora_loads_total``), the
requests each upstream served (max / mean) and the gateway's placements
(``sweetspot_routing_adapter_decisions_total``). The goal of issue #40: with affinity, TTFT p99 at least 1.5x
lower, adapter loads at least 5x fewer, no upstream above 1.25x the mean load.
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
#: The two policies: the gateway's ``routing`` setting each runs with.
POLICIES = {"affinity": "prefix", "least_loaded": "least_loaded"}
BASE_MODEL = "base"
#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py): both policies, two simulators four
#: times faster, four adapters, a few clients for seconds.
QUICK = {
    "upstreams": 2,
    "adapters": 4,
    "max_loras": 2,
    "clients": 6,
    "warmup": 1.0,
    "duration": 3.0,
    "time_scale": 4.0,
}


@dataclass
class Run(RunCounts):
    policy: str
    round: int = 0
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0  # output chunks received inside the measurement window
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    upstream_requests: list[float] = field(default_factory=list)
    adapter_loads: float = 0.0  # loads the simulators made inside the window
    placements: dict[str, float] = field(default_factory=dict)

    @property
    def loads_per_minute(self) -> float:
        return self.adapter_loads * 60.0 / self.seconds if self.seconds else 0.0


def adapter_names(count: int) -> list[str]:
    return [f"adapter-{k:02d}" for k in range(1, count + 1)]


def zipf_weights(count: int, s: float) -> list[float]:
    """Probability of the k-th most popular of ``count`` adapters, proportional to 1/k^s."""
    raw = [1.0 / k**s for k in range(1, count + 1)]
    total = sum(raw)
    return [w / total for w in raw]


async def client(
    session: aiohttp.ClientSession,
    url: str,
    rng: random.Random,
    adapters: list[str],
    weights: list[float],
    tag: str,
    number: int,
    run: Run,
    window: Window,
    think_s: float,
) -> None:
    i = 0
    while time.monotonic() < window.end:
        i += 1
        model = rng.choices(adapters, weights)[0]
        prompt = f"{tag} request {number}-{i}: " + words(rng, rng.randint(200, 1500))
        messages = [{"role": "user", "content": prompt}]
        await stream_chat(session, url, model, messages, rng.randint(48, 160), run, window)
        await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))


async def drive(url: str, sims: list[RunningProcess], args: argparse.Namespace, run: Run, tag: str) -> None:
    """The clients, from now to the window's end; the simulators' counters read at the window's edges."""
    t0 = time.monotonic()
    window = Window(t0 + args.warmup, t0 + args.warmup + args.duration)
    adapters = adapter_names(args.adapters)
    weights = zipf_weights(args.adapters, args.zipf)
    edges: list[list[dict[str, float]]] = []

    async def read_edges() -> None:
        for at in (window.start, window.end):
            await asyncio.sleep(max(at - time.monotonic(), 0.0))
            edges.append(await asyncio.gather(*(asyncio.to_thread(scrape, sim.url) for sim in sims)))

    async with client_session() as session:
        clients = [
            client(session, url, random.Random(f"{args.seed}-{c}"), adapters, weights, tag, c, run, window, args.think)
            for c in range(args.clients)
        ]
        await staggered(clients, args.stagger, read_edges())
    before, after = edges
    run.upstream_requests = deltas(after, before, "vllm:request_success_total")
    run.adapter_loads = sum(deltas(after, before, "sweetspot_sim_lora_loads_total"))
    run.seconds = args.duration


def one_run(policy: str, args: argparse.Namespace, round_: int) -> Run:
    modules = [f"--lora-modules={name}=/adapters/{name}" for name in adapter_names(args.adapters)]
    lora = ["--max-loras", str(args.max_loras), "--lora-load-ms", str(args.lora_load_ms), *modules]
    sims = start_sims(args.upstreams, args.profile, args.time_scale, BASE_MODEL, lora)
    run = Run(policy, round_)
    try:
        gateway, url = start_gateway(POLICIES[policy], args.limit, sims)
        try:
            asyncio.run(drive(url, sims, args, run, f"run-{policy}-{time.time_ns()}"))
            gw = scrape(url)
        finally:
            gateway.stop()
    finally:
        for sim in sims:
            sim.stop()
    run.placements = labelled(gw, "sweetspot_routing_adapter_decisions_total")
    return run


def summary(runs: list[Run]) -> list[dict[str, object]]:
    """Per policy, the median over rounds; gains against least-loaded's medians (its value / this one's)."""
    base = [r for r in runs if r.policy == "least_loaded"]
    base_p99 = median([pct(r.ttft, 99) for r in base])
    base_loads = median([r.loads_per_minute for r in base])
    rows: list[dict[str, object]] = []
    for policy in dict.fromkeys(r.policy for r in runs):
        mine = [r for r in runs if r.policy == policy]
        p99 = median([pct(r.ttft, 99) for r in mine])
        loads = median([r.loads_per_minute for r in mine])
        rows.append(
            {
                "policy": policy,
                "rounds": len(mine),
                "ttft_p50_median_ms": round(median([pct(r.ttft, 50) for r in mine]) * 1000),
                "ttft_p99_ms": [round(pct(r.ttft, 99) * 1000) for r in mine],
                "ttft_p99_median_ms": round(p99 * 1000),
                "p99_gain": base_p99 / p99 if p99 else float("nan"),
                "adapter_loads_per_min_median": round(loads, 1),
                "loads_gain": base_loads / loads if loads else float("inf"),
                "tokens_per_s_median": round(median([r.tokens_per_s for r in mine])),
                "max_over_mean_load_worst": max(r.max_over_mean_load for r in mine),
                "requests_median": median([float(r.requests) for r in mine]),
                "errors_total": sum(r.errors for r in mine),
            }
        )
    return rows


def report(runs: list[Run], rows: list[dict[str, object]]) -> None:
    table = Table(title="every run")
    for col in ("round", "policy", "req", "err", "TTFT p50 ms", "TTFT p99 ms", "out tok/s", "loads/min"):
        table.add_column(col, justify="right")
    for col in ("load max/mean", "requests per upstream", "placements"):
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(
            str(r.round),
            r.policy,
            str(r.requests),
            str(r.errors),
            f"{pct(r.ttft, 50) * 1000:.0f}",
            f"{pct(r.ttft, 99) * 1000:.0f}",
            f"{r.tokens_per_s:.0f}",
            f"{r.loads_per_minute:.1f}",
            f"{r.max_over_mean_load:.2f}",
            " ".join(f"{v:.0f}" for v in r.upstream_requests),
            " ".join(f"{k}={v:.0f}" for k, v in sorted(r.placements.items())),
        )
    console.print(table)
    table = Table(title="medians over rounds (gains: least_loaded's median / this policy's)")
    for col in ("policy", "rounds", "TTFT p50", "TTFT p99 per round", "p99 median", "p99 gain", "loads/min"):
        table.add_column(col, justify="right")
    for col in ("loads gain", "out tok/s", "load max/mean (worst)"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(
            str(row["policy"]),
            str(row["rounds"]),
            str(row["ttft_p50_median_ms"]),
            " ".join(str(v) for v in row["ttft_p99_ms"]),  # type: ignore[attr-defined]
            str(row["ttft_p99_median_ms"]),
            f"{row['p99_gain']:.2f}x",
            str(row["adapter_loads_per_min_median"]),
            f"{row['loads_gain']:.1f}x",
            str(row["tokens_per_s_median"]),
            f"{row['max_over_mean_load_worst']:.2f}",
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstreams", type=int, default=4)
    parser.add_argument("--adapters", type=int, default=12, help="adapters every upstream serves")
    parser.add_argument("--zipf", type=float, default=1.1, help="the adapters' popularity exponent s")
    parser.add_argument("--max-loras", type=int, default=4, help="distinct adapters per batch (and resident)")
    parser.add_argument("--lora-load-ms", type=float, default=40.0, help="a non-resident adapter's load cost")
    add_load_args(
        parser,
        clients=(40, "closed-loop clients"),
        think=(0.3, "mean seconds between a reply and the next request"),
        stagger=0.05,
        warmup=15.0,
        duration=60.0,
    )
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    add_round_args(parser)
    add_quick(parser, QUICK)
    args = parse(parser)

    runs: list[Run] = []
    for round_ in range(args.rounds):
        for policy in rotated(args.policies, round_):
            console.print(f"[bold]round {round_}: {policy}[/] ...")
            run = one_run(policy, args, round_)
            runs.append(run)
            console.print(
                f"  TTFT p50 {pct(run.ttft, 50) * 1000:.0f} ms, p99 {pct(run.ttft, 99) * 1000:.0f} ms, "
                f"{run.loads_per_minute:.1f} loads/min, load max/mean {run.max_over_mean_load:.2f}, "
                f"placements {run.placements}"
            )
    rows = summary(runs)
    report(runs, rows)
    if args.json:
        write_json(args.json, args, rows, runs, ("tokens_per_s", "loads_per_minute", "max_over_mean_load"))


if __name__ == "__main__":
    main()
