"""How far ``sweetspot serve --workers N`` scales: the streamed-chunk ceiling of 1 and 2 workers beside
nginx, in one run.

    .venv/bin/python -m bench.workers                     # real llama-server, near-free model
    .venv/bin/python -m bench.workers --upstream URL      # any OpenAI-compatible server
    .venv/bin/python -m bench.workers --json out/workers.json
    .venv/bin/python -m bench.workers --quick             # a smoke run: every figure, in seconds

Configurations, each in front of the same upstream, measured in rounds that rotate their order:
  * nginx: the C floor (one process, ``bench/_nginx.py``), when an ``nginx`` binary is installed;
  * workers=1: ``sweetspot serve --no-control`` as one process;
  * workers=2: the same with ``--workers 2`` (two processes on one port, ``SO_REUSEPORT``).

Each configuration streams at ``--concurrency`` (by default more than one worker can carry). Measured:
chunks/s, the proxy's CPU (user + system of the parent and every worker, over the run) and so the CPU
per chunk; the **ceiling** is chunks/s at 100% of the cores the proxy may use (one per worker, one for
nginx): ``cores / (CPU per chunk)``. Where there are enough cores, the load generator (this process)
and the upstream are pinned to cores the proxy does not use, so the proxy's cores are its own; on a
small machine they share, and the measured chunks/s says less than the CPU per chunk. The scaling of
two workers is reported both ways: ceiling(2) / ceiling(1), and the measured chunks/s ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench._json import write_json
from bench._nginx import start_nginx
from bench._procs import cpu_seconds, gateway_cmd, start
from bench._quick import add_quick, parse
from bench.overhead import Run, first_model, load, start_llama
from gateway.common.processes import LISTENING

console = Console(width=None if sys.stdout.isatty() else 150)
#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py).
QUICK = {"seconds": 1.0, "rounds": 1, "concurrency": 4, "max_tokens": 16}


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (the workers of a ``--workers`` gateway, under any wrapper)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(parents.get(current, []))
    return out


def tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # the process has gone
            total += cpu_seconds(pid)
    return total


def pin(pids: list[int], cores: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):  # the process has gone
            os.sched_setaffinity(pid, cores)


async def measure(
    url: str, model: str, pids: list[int], *, concurrency: int, seconds: float, max_tokens: int
) -> tuple[Run, float]:
    """One streamed run; returns it and the CPU seconds every process of the proxy spent over it."""
    before = tree_cpu(pids)
    run = await load(url, model, concurrency=concurrency, seconds=seconds, stream=True, max_tokens=max_tokens, pid=None)
    return run, tree_cpu(pids) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", help="OpenAI-compatible base URL (default: start llama-server)")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each measured run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each configuration")
    parser.add_argument("--concurrency", type=int, default=32, help="streams at once")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per streamed request")
    parser.add_argument("--json", type=Path, help="write the results here")
    add_quick(parser, QUICK)
    args = parse(parser)

    cores = sorted(os.sched_getaffinity(0))
    # With 5 cores or more: the proxy gets the last two (one per worker), everything else the rest.
    proxy_cores = set(cores[-2:]) if len(cores) >= 5 else set(cores)
    other_cores = set(cores) - proxy_cores if len(cores) >= 5 else set(cores)
    pin([os.getpid()], other_cores)

    upstream_proc = None
    if args.upstream:
        upstream = args.upstream.rstrip("/")
    else:
        upstream_proc, upstream = start_llama()
        pin(tree(upstream_proc.pid), other_cores)
    cleanup = []
    proxies: dict[str, tuple[str, list[int], int]] = {}  # name -> (url, pids, cores it may use)
    try:
        nginx = start_nginx(upstream)
        if nginx is None:
            console.print("[yellow]nginx is not installed: measured without it (apt-get install nginx-light)[/yellow]")
        else:
            proc, url, tmp = nginx
            cleanup += [proc.stop, tmp.cleanup]
            proxies["nginx"] = (url, [proc.pid], 1)
        for workers in (1, 2):
            proc, url = start(
                gateway_cmd(
                    upstream,
                    "--no-control",
                    "--initial-limit",
                    "256",
                    "--max-queue",
                    "20000",
                    "--log-level",
                    "warning",
                    "--workers",
                    str(workers),
                ),
                LISTENING,
            )
            cleanup.append(proc.stop)
            pids = tree(proc.pid)
            proxies[f"workers={workers}"] = (url, pids, workers)
        for _, pids, _ in proxies.values():
            pin(pids, proxy_cores)
        results = asyncio.run(bench(upstream, proxies, args))
    finally:
        for step in reversed(cleanup):
            step()
        if upstream_proc is not None:
            upstream_proc.stop()
    results["cores"] = {"machine": len(cores), "proxy": sorted(proxy_cores), "others": sorted(other_cores)}
    report(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, results, indent=2)
        console.print(f"wrote {args.json}")


async def bench(upstream: str, proxies: dict[str, tuple[str, list[int], int]], args: argparse.Namespace) -> dict:
    model = await first_model(upstream)
    names = list(proxies)
    runs: dict[str, list[tuple[Run, float]]] = {name: [] for name in names}
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            url, pids, _ = proxies[name]
            runs[name].append(
                await measure(
                    url, model, pids, concurrency=args.concurrency, seconds=args.seconds, max_tokens=args.max_tokens
                )
            )
    out: dict = {
        "model": model,
        "upstream": upstream,
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "proxies": {},
    }
    for name in names:
        measured = runs[name]
        chunks = sum(run.chunks for run, _ in measured)
        cpu = sum(cpu_s for _, cpu_s in measured)
        seconds = sum(run.seconds for run, _ in measured)
        per_chunk_us = cpu / chunks * 1e6 if chunks else None
        cores = proxies[name][2]
        out["proxies"][name] = {
            "chunks_per_s": round(statistics.median(run.chunks_per_s for run, _ in measured), 1),
            "cpu_cores_busy": round(cpu / seconds, 2) if seconds else None,
            "cpu_us_per_chunk": None if per_chunk_us is None else round(per_chunk_us, 1),
            "cores": cores,
            "ceiling_chunks_per_s": None if not per_chunk_us else round(cores * 1e6 / per_chunk_us),
            "errors": sum(run.errors for run, _ in measured),
        }
    one, two = out["proxies"].get("workers=1"), out["proxies"].get("workers=2")
    if one and two and one["ceiling_chunks_per_s"] and one["chunks_per_s"]:
        out["scaling"] = {
            "ceiling_ratio": round(two["ceiling_chunks_per_s"] / one["ceiling_chunks_per_s"], 2),
            "measured_ratio": round(two["chunks_per_s"] / one["chunks_per_s"], 2),
        }
    return out


def report(results: dict) -> None:
    table = Table(
        title=f"streamed-chunk ceiling, c={results['concurrency']} ({results['model']} @ {results['upstream']})"
    )
    for column in ("proxy", "chunks/s", "CPU cores busy", "CPU per chunk", "cores", "ceiling chunks/s", "failed"):
        table.add_column(column, justify="left" if column == "proxy" else "right")
    for name, r in results["proxies"].items():
        table.add_row(
            name,
            f"{r['chunks_per_s']:.0f}",
            f"{r['cpu_cores_busy']}",
            f"{r['cpu_us_per_chunk']} us",
            str(r["cores"]),
            str(r["ceiling_chunks_per_s"]),
            str(r["errors"]),
        )
    console.print(table)
    if "scaling" in results:
        s = results["scaling"]
        console.print(
            f"2 workers / 1 worker: ceiling {s['ceiling_ratio']}x, measured chunks/s {s['measured_ratio']}x "
            f"(cores: {results['cores']})"
        )


if __name__ == "__main__":
    main()
