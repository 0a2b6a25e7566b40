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
import contextlib
import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

from bench._procs import start
from bench._quick import add_quick, parse
from bench.routing import Window, pct, scrape, words
from gateway.common.processes import LISTENING, RunningProcess

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
class Run:
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
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def loads_per_minute(self) -> float:
        return self.adapter_loads * 60.0 / self.seconds if self.seconds else 0.0

    @property
    def max_over_mean_load(self) -> float:
        mean = sum(self.upstream_requests) / len(self.upstream_requests) if self.upstream_requests else 0.0
        return max(self.upstream_requests) / mean if mean else float("nan")


def adapter_names(count: int) -> list[str]:
    return [f"adapter-{k:02d}" for k in range(1, count + 1)]


def zipf_weights(count: int, s: float) -> list[float]:
    """Probability of the k-th most popular of ``count`` adapters, proportional to 1/k^s."""
    raw = [1.0 / k**s for k in range(1, count + 1)]
    total = sum(raw)
    return [w / total for w in raw]


async def stream_chat(
    session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int, run: Run, window: Window
) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    sent = time.monotonic()
    counted = window.inside(sent)
    first: float | None = None
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                await resp.read()
                run.errors += counted
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if not choices or not choices[0].get("delta", {}).get("content"):
                    continue
                now = time.monotonic()
                if first is None:
                    first = now
                if window.inside(now):
                    run.tokens += 1
    except (TimeoutError, aiohttp.ClientError):
        run.errors += counted
        return
    if counted and first is not None:
        run.ttft.append(first - sent)
        run.requests += 1


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
        await stream_chat(session, url, model, prompt, rng.randint(48, 160), run, window)
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

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        clients = [
            client(session, url, random.Random(f"{args.seed}-{c}"), adapters, weights, tag, c, run, window, args.think)
            for c in range(args.clients)
        ]

        async def staggered(k: int, coro: object) -> None:
            await asyncio.sleep(k * args.stagger)
            await coro  # type: ignore[misc]

        await asyncio.gather(read_edges(), *(staggered(k, c) for k, c in enumerate(clients)))
    before, after = edges

    def delta(name: str) -> list[float]:
        return [a.get(name, 0.0) - b.get(name, 0.0) for a, b in zip(after, before, strict=True)]

    run.upstream_requests = delta("vllm:request_success_total")
    run.adapter_loads = sum(delta("sweetspot_sim_lora_loads_total"))
    run.seconds = args.duration


def start_sims(args: argparse.Namespace) -> list[RunningProcess]:
    modules = [f"--lora-modules={name}=/adapters/{name}" for name in adapter_names(args.adapters)]

    def one(i: int) -> RunningProcess:
        proc, _ = start(
            [
                sys.executable,
                "-m",
                "gateway",
                "sim",
                "--port",
                "0",
                "--profile",
                args.profile,
                "--time-scale",
                str(args.time_scale),
                "--model-name",
                BASE_MODEL,
                "--seed",
                str(i),
                "--max-loras",
                str(args.max_loras),
                "--lora-load-ms",
                str(args.lora_load_ms),
                *modules,
            ],
            LISTENING,
        )
        return proc

    sims: list[RunningProcess] = []
    with ThreadPoolExecutor(args.upstreams) as pool:  # side by side: each takes a second or two to start
        futures = [pool.submit(one, i) for i in range(args.upstreams)]
        for future in futures:
            with contextlib.suppress(Exception):  # raised again below, once every started one is kept
                sims.append(future.result())
        try:
            for future in futures:
                future.result()
        except BaseException:
            for sim in sims:
                sim.stop()
            raise
    return sims


def one_run(policy: str, args: argparse.Namespace, round_: int) -> Run:
    sims = start_sims(args)
    run = Run(policy, round_)
    try:
        cmd = [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--port",
            "0",
            "--no-control",
            "--routing",
            POLICIES[policy],
            "--initial-limit",
            str(args.limit),
            "--log-level",
            "warning",
        ]
        for sim in sims:
            cmd += ["--upstream", sim.url]
        gateway, url = start(cmd, LISTENING, env={"SWEETSPOT_ACCESS_LOG": "false"})
        try:
            asyncio.run(drive(url, sims, args, run, f"run-{policy}-{time.time_ns()}"))
            gw = scrape(url)
        finally:
            gateway.stop()
    finally:
        for sim in sims:
            sim.stop()
    prefix = "sweetspot_routing_adapter_decisions_total|"
    run.placements = {k.split("|", 1)[1]: v for k, v in gw.items() if k.startswith(prefix)}
    return run


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


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
    parser.add_argument("--clients", type=int, default=40, help="closed-loop clients")
    parser.add_argument("--limit", type=int, default=16, help="fixed concurrency limit per upstream")
    parser.add_argument("--think", type=float, default=0.3, help="mean seconds between a reply and the next request")
    parser.add_argument("--stagger", type=float, default=0.05, help="seconds between client starts")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--profile", default="qwen3.6-35b-a3b-32gb")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--rounds", type=int, default=1, help="repeat every run, rotating the policies' order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    add_quick(parser, QUICK)
    args = parse(parser)

    runs: list[Run] = []
    for round_ in range(args.rounds):
        shift = round_ % len(args.policies)  # a drift of the (shared) machine hits every policy alike
        for policy in args.policies[shift:] + args.policies[:shift]:
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
        per_run = [
            {k: v for k, v in asdict(r).items() if k != "ttft"}
            | {
                "ttft_p50_s": pct(r.ttft, 50),
                "ttft_p99_s": pct(r.ttft, 99),
                "tokens_per_s": r.tokens_per_s,
                "loads_per_minute": r.loads_per_minute,
                "max_over_mean_load": r.max_over_mean_load,
            }
            for r in runs
        ]
        payload = {"args": {k: str(v) for k, v in vars(args).items()}, "summary": rows, "runs": per_run}
        args.json.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
