"""What the routing benches on simulated upstreams share (:mod:`bench.routing`, :mod:`bench.lora`).

Both start ``--upstreams`` simulators side by side, put a gateway with a fixed limit per upstream
(``--no-control``, so only the routing differs) in front of them, stream closed-loop clients through it and
count, inside a measurement window, what the clients saw and what the simulators' counters moved. The
workloads, the per-run figures and the tables are each bench's own.
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
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Protocol

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench._json import dumps
from bench._procs import start
from gateway.common.processes import LISTENING, RunningProcess

#: The words of the benches' prompts and conversations.
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


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(round(q / 100 * (len(ordered) - 1)), len(ordered) - 1)]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def words(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` simulator tokens (4 bytes each) of words."""
    out: list[str] = []
    size = 0
    while size < tokens * 4:
        w = rng.choice(VOCAB)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def rotated(policies: list[str], round_: int) -> list[str]:
    """The policies in the order of round ``round_``: a drift of the (shared) machine hits every policy alike."""
    shift = round_ % len(policies)
    return policies[shift:] + policies[:shift]


class Window:
    """The measurement window: requests that start inside it count, and chunks that arrive inside it."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end

    def inside(self, t: float) -> bool:
        return self.start <= t < self.end


class RunCounts:
    """The figures every run of both benches counts; each bench's ``Run`` dataclass declares them as fields."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    ttft: list[float]
    tokens: int  # output chunks received inside the measurement window
    requests: int
    errors: int
    seconds: float
    upstream_requests: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def max_over_mean_load(self) -> float:
        mean = sum(self.upstream_requests) / len(self.upstream_requests) if self.upstream_requests else 0.0
        return max(self.upstream_requests) / mean if mean else float("nan")


class _Counted(Protocol):
    ttft: list[float]
    tokens: int
    requests: int
    errors: int


def client_session() -> aiohttp.ClientSession:
    """The clients' session: no connection limit, a generous timeout (a request waits in the gateway's queue)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=300))


async def stream_chat(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    run: _Counted,
    window: Window,
) -> str | None:
    """One streamed chat request, counted into ``run``; returns the reply's text (None on an error)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    sent = time.monotonic()
    counted = window.inside(sent)
    first: float | None = None
    parts: list[str] = []
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                await resp.read()
                run.errors += counted
                return None
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
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
        run.errors += counted
        return None
    if counted and first is not None:
        run.ttft.append(first - sent)
        run.requests += 1
    return "".join(parts)


async def staggered(clients: Sequence[Awaitable[None]], stagger_s: float, *alongside: Awaitable[None]) -> None:
    """Run ``clients``, the k-th started ``k * stagger_s`` seconds late, and ``alongside`` at once, to their end."""

    async def late(k: int, client: Awaitable[None]) -> None:
        await asyncio.sleep(k * stagger_s)
        await client

    await asyncio.gather(*alongside, *(late(k, c) for k, c in enumerate(clients)))


def scrape(url: str) -> dict[str, float]:
    """Sums of the counters that matter here, by sample name; the routing counters also per label values."""
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


def labelled(scraped: Mapping[str, float], name: str) -> dict[str, float]:
    """The values of the routing counter ``name`` in a :func:`scrape`, by label values."""
    prefix = name + "|"
    return {k.split("|", 1)[1]: v for k, v in scraped.items() if k.startswith(prefix)}


def deltas(after: list[dict[str, float]], before: list[dict[str, float]], name: str) -> list[float]:
    """Per upstream, how far the counter ``name`` moved between two rounds of :func:`scrape`."""
    return [a.get(name, 0.0) - b.get(name, 0.0) for a, b in zip(after, before, strict=True)]


def start_sims(
    count: int, profile: str, time_scale: float, model_name: str, extra: Sequence[str] = ()
) -> list[RunningProcess]:
    """``count`` simulators, seeds 0 to count-1, started side by side (each takes a second or two)."""

    def one(i: int) -> RunningProcess:
        cmd = [sys.executable, "-m", "gateway", "sim", "--port", "0", "--profile", profile]
        cmd += ["--time-scale", str(time_scale), "--model-name", model_name, "--seed", str(i), *extra]
        proc, _ = start(cmd, LISTENING)
        return proc

    sims: list[RunningProcess] = []
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(one, i) for i in range(count)]
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


def start_gateway(
    routing: str, limit: int, sims: list[RunningProcess], env: Mapping[str, str] | None = None
) -> tuple[RunningProcess, str]:
    """A gateway in front of ``sims`` with ``--routing routing`` and a fixed ``limit`` per upstream."""
    cmd = [sys.executable, "-m", "gateway", "serve", "--port", "0", "--no-control", "--routing", routing]
    cmd += ["--initial-limit", str(limit), "--log-level", "warning"]
    for sim in sims:
        cmd += ["--upstream", sim.url]
    return start(cmd, LISTENING, env={"SWEETSPOT_ACCESS_LOG": "false", **(env or {})})


def add_load_args(
    parser: argparse.ArgumentParser,
    *,
    clients: tuple[int, str],
    think: tuple[float, str],
    stagger: float,
    warmup: float,
    duration: float,
) -> None:
    """The options of the clients' load and the simulators' speed; ``clients`` and ``think``: default and help."""
    parser.add_argument("--clients", type=int, default=clients[0], help=clients[1])
    parser.add_argument("--limit", type=int, default=16, help="fixed concurrency limit per upstream")
    parser.add_argument("--think", type=float, default=think[0], help=think[1])
    parser.add_argument("--stagger", type=float, default=stagger, help="seconds between client starts")
    parser.add_argument("--warmup", type=float, default=warmup)
    parser.add_argument("--duration", type=float, default=duration)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--profile", default="qwen3.6-35b-a3b-32gb")


def add_round_args(parser: argparse.ArgumentParser) -> None:
    """``--rounds``, ``--seed`` and ``--json``."""
    parser.add_argument("--rounds", type=int, default=1, help="repeat every run, rotating the policies' order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)


def write_json(
    path: Path, args: argparse.Namespace, rows: list[dict[str, object]], runs: Sequence[RunCounts], shown: Sequence[str]
) -> None:
    """The arguments, the summary rows and every run (its fields but the TTFTs, its percentiles, ``shown``)."""
    per_run = [
        {k: v for k, v in asdict(r).items() if k != "ttft"}
        | {"ttft_p50_s": pct(r.ttft, 50), "ttft_p99_s": pct(r.ttft, 99)}
        | {name: getattr(r, name) for name in shown}
        for r in runs
    ]
    payload = {"args": {k: str(v) for k, v in vars(args).items()}, "summary": rows, "runs": per_run}
    path.write_text(dumps(payload, indent=2) + "\n")
