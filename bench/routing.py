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
import contextlib
import json
import random
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from bench._procs import start
from bench._quick import add_quick, parse
from gateway.common.processes import LISTENING, RunningProcess

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
VOCAB = tuple(
    [
        "the",
        "a",
        "of",
        "to",
        "and",
        "in",
        "is",
        "it",
        "that",
        "for",
        "on",
        "with",
        "as",
        "was",
        "be",
        "by",
        "this",
        "are",
        "or",
        "from",
        "at",
        "an",
        "but",
        "not",
        "have",
        "has",
        "had",
        "which",
        "tide",
        "moon",
        "ocean",
        "wave",
        "river",
        "stone",
        "cloud",
        "engine",
        "kernel",
        "vector",
        "matrix",
        "cache",
        "block",
        "token",
        "server",
        "request",
        "queue",
        "limit",
        "stream",
        "model",
        "window",
        "signal",
        "sample",
        "latency",
        "memory",
        "budget",
        "report",
        "policy",
        "history",
        "answer",
        "question",
        "reason",
        "simple",
        "careful",
        "precise",
        "example",
        "detail",
        "summary",
        "context",
        "system",
        "prompt",
        "user",
        "assistant",
    ]
)


@dataclass
class Run:
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

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def max_over_mean_load(self) -> float:
        mean = sum(self.upstream_requests) / len(self.upstream_requests) if self.upstream_requests else 0.0
        return max(self.upstream_requests) / mean if mean else float("nan")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(round(q / 100 * (len(ordered) - 1)), len(ordered) - 1)]


def words(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` simulator tokens (4 bytes each) of words."""
    out: list[str] = []
    size = 0
    while size < tokens * 4:
        w = rng.choice(VOCAB)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


class Window:
    """The measurement window: requests that start inside it count, and chunks that arrive inside it."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end

    def inside(self, t: float) -> bool:
        return self.start <= t < self.end


async def stream_chat(
    session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]], max_tokens: int, run: Run, window: Window
) -> str | None:
    """One streamed chat request; returns the reply's text (None on an error)."""
    body = {"model": "sim", "messages": messages, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    sent = time.monotonic()
    counted = window.inside(sent)
    first: float | None = None
    parts: list[str] = []
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                await resp.read()
                if counted:
                    run.errors += 1
                return None
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                choices = event.get("choices") or []
                text = choices[0].get("delta", {}).get("content") if choices else None
                if not text:
                    continue
                now = time.monotonic()
                if first is None:
                    first = now
                if window.inside(now):
                    run.tokens += 1
                parts.append(text)
    except (TimeoutError, aiohttp.ClientError):
        if counted:
            run.errors += 1
        return None
    if counted and first is not None:
        run.ttft.append(first - sent)
        run.requests += 1
    return "".join(parts)


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
            reply = await stream_chat(session, url, messages, rng.randint(48, 96), run, window)
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
        await stream_chat(session, url, [{"role": "user", "content": prompt}], rng.randint(48, 96), run, window)
        await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))


def scrape(url: str) -> dict[str, float]:
    """Sums of the simulator's counters that matter here, by sample name."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
            if sample.name.startswith("sweetspot_routing_") and sample.labels:
                key = f"{sample.name}|{','.join(sample.labels.values())}"
                out[key] = sample.value
    return out


async def drive(workload: str, url: str, args: argparse.Namespace, run: Run, tag: str) -> None:
    t0 = time.monotonic()
    window = Window(t0 + args.warmup, t0 + args.warmup + args.duration)
    rng = random.Random(f"{args.seed}-{workload}")
    systems = [f"{tag} system prompt {k}: " + words(rng, 800) for k in range(4)]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        clients = []
        for c in range(args.clients):
            crng = random.Random(f"{args.seed}-{workload}-{c}")
            if workload == "multi_turn":
                clients.append(multi_turn_client(session, url, crng, systems, run, window, args.think))
            else:
                clients.append(control_client(session, url, crng, tag, c, run, window, args.think))

        async def staggered(k: int, coro: object) -> None:
            await asyncio.sleep(k * args.stagger)
            await coro  # type: ignore[misc]

        await asyncio.gather(*(staggered(k, c) for k, c in enumerate(clients)))
    run.seconds = args.duration


def one_run(
    workload: str, policy: str, sims: list[RunningProcess], args: argparse.Namespace, tag: str, round_: int
) -> Run:
    cmd = [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--port",
        "0",
        "--no-control",
        "--routing",
        policy,
        "--initial-limit",
        str(args.limit),
        "--log-level",
        "warning",
    ]
    for sim in sims:
        cmd += ["--upstream", sim.url]
    gateway, url = start(
        cmd, LISTENING, env={"SWEETSPOT_ACCESS_LOG": "false", "SWEETSPOT_ROUTING_LOAD_WEIGHT": str(args.load_weight)}
    )
    run = Run(workload, policy, round_)
    try:
        before = [scrape(sim.url) for sim in sims]
        asyncio.run(drive(workload, url, args, run, tag))
        after = [scrape(sim.url) for sim in sims]
        gw = scrape(url)
    finally:
        gateway.stop()

    def delta(name: str) -> list[float]:
        return [a.get(name, 0.0) - b.get(name, 0.0) for a, b in zip(after, before, strict=True)]

    run.upstream_requests = delta("vllm:request_success_total")
    queries, hits = sum(delta("vllm:prefix_cache_queries_total")), sum(delta("vllm:prefix_cache_hits_total"))
    run.sim_hit_rate = hits / queries if queries else 0.0
    chunks = sum(v for k, v in gw.items() if k.startswith("sweetspot_routing_prefix_chunks_total|"))
    hit_chunks = sum(v for k, v in gw.items() if k.startswith("sweetspot_routing_prefix_hit_chunks_total|"))
    run.gateway_hit_estimate = hit_chunks / chunks if chunks else None
    run.decisions = {k.split("|", 1)[1]: v for k, v in gw.items() if k.startswith("sweetspot_routing_decisions_total|")}
    return run


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


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
    parser.add_argument("--clients", type=int, default=48, help="closed-loop clients (conversations at a time)")
    parser.add_argument("--limit", type=int, default=16, help="fixed concurrency limit per upstream")
    parser.add_argument("--think", type=float, default=0.5, help="mean seconds between a reply and the next turn")
    parser.add_argument("--stagger", type=float, default=0.1, help="seconds between client starts")
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--profile", default="qwen3.6-35b-a3b-32gb")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--load-weight", type=float, default=1.0, help="the gateway's routing_load_weight")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every run, rotating the policies' order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    add_quick(parser, QUICK)
    args = parse(parser)

    sims: list[RunningProcess] = []
    runs: list[Run] = []

    def start_sim(i: int) -> RunningProcess:
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
                "--max-model-len",
                "16384",
                "--time-scale",
                str(args.time_scale),
                "--model-name",
                "sim",
                "--seed",
                str(i),
            ],
            LISTENING,
        )
        return proc

    try:
        with ThreadPoolExecutor(args.upstreams) as pool:  # side by side: each takes a second or two to start
            futures = [pool.submit(start_sim, i) for i in range(args.upstreams)]
            for future in futures:
                with contextlib.suppress(Exception):  # raised again below, once every started one is kept
                    sims.append(future.result())
            for future in futures:
                future.result()
        for round_ in range(args.rounds):
            for workload in args.workloads:
                # the order rotates per round, so a drift of the (shared) machine hits every policy alike
                shift = round_ % len(args.policies)
                for policy in args.policies[shift:] + args.policies[:shift]:
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
        per_run = [
            {k: v for k, v in asdict(r).items() if k != "ttft"}
            | {
                "ttft_p50_s": pct(r.ttft, 50),
                "ttft_p99_s": pct(r.ttft, 99),
                "tokens_per_s": r.tokens_per_s,
                "max_over_mean_load": r.max_over_mean_load,
            }
            for r in runs
        ]
        payload = {"args": {k: str(v) for k, v in vars(args).items()}, "summary": rows, "runs": per_run}
        args.json.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
