"""Can the simulator keep up with the GPU it pretends to be? (It must never be the bottleneck.)

Starts ``sweetspot sim`` in real time (``--time-scale 1``), drives it with N closed-loop
streaming clients (aiohttp, one SSE event per token, as vLLM streams), and compares the streamed
chunks per second it actually delivered with what the pure model predicts for the same load.
It also reports the CPU the server process used (from /proc), i.e. the headroom left.

    .venv/bin/python -m bench.sim_throughput                 # default profile, 48 clients, 512+512
    .venv/bin/python -m bench.sim_throughput --concurrency 32 64 --duration 30 --json out/sim.json
    .venv/bin/python -m bench.sim_throughput --quick         # a smoke run, in seconds

Output: a table (rich) and, with --json, the same numbers as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

from bench._http import BenchError
from bench._json import write_json
from bench._quick import add_quick, parse
from gateway.sim.oracle import predict_closed_loop
from gateway.sim.profiles import DEFAULT_PROFILE, get_profile

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py).
QUICK = {"concurrency": [4], "prompt_tokens": 64, "output_tokens": 64, "warmup": 1.0, "duration": 2.0}


@dataclass
class Result:
    concurrency: int
    predicted_tokens_per_s: float
    chunks_per_s: float
    ratio: float
    server_cpu_percent: float  # of one core
    client_cpu_percent: float
    requests_done: int
    window_s: float


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def start_sim(profile: str, extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    exe = Path(sys.executable).with_name("sweetspot")
    proc = subprocess.Popen(
        [str(exe), "sim", "--port", "0", "--profile", profile, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            break
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise SystemExit("sweetspot sim did not start")


async def drive(
    url: str, concurrency: int, prompt: int, output: int, warmup: float, duration: float, sim_pid: int
) -> Result:
    chunks = 0
    done = 0
    counting = False
    stop = False
    body = {"prompt": [1] * prompt, "max_tokens": output, "ignore_eos": True, "stream": True}

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal chunks, done
        while not stop:
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                resp.raise_for_status()
                async for line in resp.content:
                    if line.startswith(b"data: {") and counting:
                        chunks += 1
            if counting:
                done += 1

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(concurrency)]
        await asyncio.sleep(warmup)
        counting = True
        s0, c0, t0 = cpu_seconds(sim_pid), time.process_time(), time.monotonic()
        await asyncio.sleep(duration)
        counting = False
        s1, c1, t1 = cpu_seconds(sim_pid), time.process_time(), time.monotonic()
        n, window = chunks, t1 - t0
        stop = True
        for t in tasks:
            t.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [e for e in ended if isinstance(e, Exception) and not isinstance(e, asyncio.CancelledError)]
    if failed:
        raise BenchError(f"{len(failed)} of {concurrency} clients failed; the first: {failed[0]!r}")
    return Result(concurrency, 0.0, n / window, 0.0, 100 * (s1 - s0) / window, 100 * (c1 - c0) / window, done, window)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[48])
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=512)
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before counting")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds counted")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    add_quick(ap, QUICK)
    args = parse(ap)
    profile = get_profile(args.profile)
    console = Console()
    results: list[Result] = []
    proc, url = start_sim(args.profile, ["--time-scale", str(args.time_scale)])
    try:
        for n in args.concurrency:
            pred = predict_closed_loop(profile, n, args.prompt_tokens, args.output_tokens).tokens_per_s
            pred *= args.time_scale
            r = asyncio.run(drive(url, n, args.prompt_tokens, args.output_tokens, args.warmup, args.duration, proc.pid))
            r.predicted_tokens_per_s, r.ratio = pred, r.chunks_per_s / pred
            results.append(r)
    finally:
        proc.terminate()
        proc.wait(10)
    table = Table(
        title=f"sweetspot sim, profile {profile.name}, {args.prompt_tokens}+{args.output_tokens} "
        f"tokens, time scale {args.time_scale}"
    )
    for col in (
        "clients",
        "predicted tok/s",
        "streamed chunks/s",
        "measured/predicted",
        "server CPU",
        "client CPU",
        "requests",
    ):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            str(r.concurrency),
            f"{r.predicted_tokens_per_s:.0f}",
            f"{r.chunks_per_s:.0f}",
            f"{r.ratio:.3f}",
            f"{r.server_cpu_percent:.0f}%",
            f"{r.client_cpu_percent:.0f}%",
            str(r.requests_done),
        )
    console.print(table)
    console.print(
        f"CPU in % of one core, over {args.duration:.0f}s windows after {args.warmup:.0f}s warm-up; "
        f"{os.cpu_count()} cores on this machine."
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, [asdict(r) for r in results], indent=2)


if __name__ == "__main__":
    main()
