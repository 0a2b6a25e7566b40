"""Tokens/s of a real llama-server on the tiny test model, direct (no gateway), per concurrency level.

Starts llama-server (built by ``make llama-server``) with N slots on the generated model, then for each
level runs that many closed-loop streaming clients (aiohttp, ``ignore_eos``, fixed ``max_tokens``) for a
fixed time and counts the tokens that arrived inside the measured window (the tiny model streams exactly
one chunk per token). TTFT and TPOT are per finished request.

    .venv/bin/python -m bench.llama_direct                          # 8 slots, levels 1 4 8 16
    .venv/bin/python -m bench.llama_direct --slots 4 --levels 1 2 4 8 --duration 20 --json out/direct.json
    .venv/bin/python -m bench.llama_direct --quick                  # a smoke run, in seconds

The machine is shared and has 2 cores: numbers move with whatever else runs; the load average before
and after each level is printed next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

from bench._json import write_json
from bench._quick import add_quick, parse
from testbed.llama_process import start_server
from testbed.llama_server import LlamaServerConfig
from testbed.tiny_gguf import TinyModelSpec, ensure_model

#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py).
QUICK = {"slots": 2, "threads": 1, "levels": [1, 2], "duration": 1.0, "warmup": 0.5, "max_tokens": 16}


@dataclass
class Level:
    concurrency: int
    tokens_per_s: float
    requests: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    load_before: float
    load_after: float


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))] * 1000


async def run_level(url: str, concurrency: int, duration: float, warmup: float, max_tokens: int) -> Level:
    """Closed loop: ``concurrency`` clients, each sending its next request when the previous one ends.

    The client is kept cheap (aiohttp, SSE events counted without JSON parsing) because on 2 cores
    every cycle it spends is taken from the server it measures. ``force_close``: llama-server closes
    the connection after every streamed response while announcing keep-alive, so a pooled connection
    reused right after fails.
    """
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    start_w, end_w = t0 + warmup, t0 + warmup + duration
    tokens_in_window = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)

    async def worker(session: aiohttp.ClientSession, i: int) -> None:
        nonlocal tokens_in_window
        body = {
            "model": "tiny-llama",
            "prompt": f"Client {i} says hello to the server and asks for a story.",
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
        while time.monotonic() < end_w:
            sent = time.monotonic()
            first = last = None
            n = 0
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                resp.raise_for_status()
                async for line in resp.content:
                    if not line.startswith(b"data: {"):
                        continue  # blank separators and the final [DONE]
                    now = time.monotonic()
                    n += 1  # the tiny model streams one event per token (usage comes only if asked)
                    first = first or now
                    last = now
                    if start_w <= now < end_w:
                        tokens_in_window += 1
            if first is not None and last is not None and sent >= start_w and last < end_w:
                ttfts.append(first - sent)
                if n > 1:
                    tpots.append((last - first) / (n - 1))

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session, i) for i in range(concurrency)))
    return Level(
        concurrency,
        tokens_in_window / duration,
        len(ttfts),
        pct(ttfts, 50),
        pct(ttfts, 99),
        statistics.median(tpots) * 1000 if tpots else None,
        load_before,
        os.getloadavg()[0],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--ctx-per-slot", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--duration", type=float, default=15.0, help="measured seconds per level")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds per level before measuring")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path)
    add_quick(ap, QUICK)
    args = parse(ap)

    cfg = LlamaServerConfig(
        model=ensure_model(TinyModelSpec()),
        port=0,
        parallel=args.slots,
        ctx_per_slot=args.ctx_per_slot,
        threads=args.threads,
        alias="tiny-llama",
    )
    proc = start_server(cfg)
    url = proc.url
    try:
        levels = [asyncio.run(run_level(url, c, args.duration, args.warmup, args.max_tokens)) for c in args.levels]
    finally:
        proc.stop()

    table = Table(title=f"llama-server direct: {args.slots} slots, tiny model, {args.max_tokens} tokens/request")
    for col in ("conc", "tok/s", "requests", "TTFT p50/p99 ms", "TPOT p50 ms", "load avg before/after"):
        table.add_column(col, justify="right")
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    for lv in levels:
        table.add_row(
            str(lv.concurrency),
            f"{lv.tokens_per_s:.0f}",
            str(lv.requests),
            f"{fmt(lv.ttft_p50_ms)} / {fmt(lv.ttft_p99_ms)}",
            f"{lv.tpot_p50_ms or 0:.1f}",
            f"{lv.load_before:.1f} / {lv.load_after:.1f}",
        )
    Console().print(table)
    if args.json:
        write_json(
            args.json,
            {"settings": vars(args) | {"json": str(args.json)}, "levels": [asdict(lv) for lv in levels]},
            indent=2,
        )


if __name__ == "__main__":
    main()
