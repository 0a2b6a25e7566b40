"""Where the gateway's CPU goes: py-spy flame graphs of a non-streamed request and of streamed chunks, and a
table of what each part of the hot path costs.

    .venv/bin/python -m bench.profile                          # writes docs/profile/*.svg and docs/profile.json
    .venv/bin/python -m bench.profile --seconds 20 --out /tmp/profile
    .venv/bin/python -m bench.profile --quick --out /tmp/p     # a smoke run: every file, in seconds

The gateway runs as ``bench/overhead.py`` runs it (``--no-control``, a limit above the load) with the features
a production deployment has on: tenants identified by key (the load sends one tenant's key), the JSON access
log, metrics. Its upstream is llama-server's near-free model, so the proxy's own CPU decides. For each load
(``plain``: non-streamed requests at concurrency 32; ``stream``: streamed 64-token answers at concurrency 8)
py-spy attaches to the gateway twice while the load runs: once writing a flame graph (SVG) and once writing
folded stacks, from which each frame's share of the samples is summed into the parts below (a frame belongs
to the first part, in the order listed, whose pattern its file matches; the innermost matching frame of a
stack decides, so a sample in aiohttp called from the relay is aiohttp's).

py-spy samples the thread holding the GIL (``--gil``): the gateway's work is all on its event loop's thread, and
without it py-spy counts the idle threads of the default executor, blocked in ``queue.get``, as busy (a third
of the samples, where /proc shows them using none). It pauses the process for each sample, which slows it a
little but not the shape.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench._json import write_json
from bench._procs import ROOT, gateway_cmd, start
from bench._quick import add_quick, parse
from bench.overhead import BENCH_KEY, TENANTS_ENV, first_model, load, start_llama
from gateway.common.processes import LISTENING

console = Console(width=None if sys.stdout.isatty() else 150)

LOADS = {
    "plain": dict(concurrency=32, stream=False, max_tokens=1),
    "stream": dict(concurrency=8, stream=True, max_tokens=64),
}

#: The parts of the hot path, as (name, substrings of a frame's file or function); the first match wins.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("access log", ("gateway/server/process/logs", "logging/", "msgspec")),
    ("metrics", ("gateway/metrics", "prometheus_client")),
    ("validation (pydantic)", ("gateway/server/routes/validation", "pydantic")),
    ("admission (queue, limiter, tenants)", ("gateway/server/admission",)),
    ("relay (SSE, measurement, watch)", ("gateway/server/relay",)),
    ("upstream pool", ("gateway/server/upstream",)),
    ("routes (forward, errors)", ("gateway/server/routes",)),
    ("front door, drain", ("gateway/server/process", "gateway/common")),
    ("other gateway code", ("gateway/",)),
    ("FastAPI / Starlette", ("fastapi/", "starlette/")),
    ("uvicorn, httptools", ("uvicorn/", "httptools")),
    ("aiohttp (upstream client)", ("aiohttp/", "multidict", "yarl/")),
    ("asyncio, uvloop", ("asyncio/", "uvloop")),
    ("json", ("json/",)),
)
OTHER = "other (interpreter, stdlib)"

QUICK = {"seconds": 2.0, "rate": 200}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", help="OpenAI-compatible base URL (default: start llama-server)")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds py-spy records, each of the 4 times")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "profile", help="folder for SVGs and JSON")
    parser.add_argument("--keep-folded", action="store_true", help="keep py-spy's folded stacks (NAME.folded)")
    add_quick(parser, QUICK)
    return parse(parser, argv)


def part_of(frame: str) -> str | None:
    for name, patterns in PARTS:
        if any(pattern in frame for pattern in patterns):
            return name
    return None


def attribute(folded: str) -> Counter[str]:
    """Samples per part, from py-spy's folded stacks (``frame;frame;... count``, outermost frame first)."""
    parts: Counter[str] = Counter()
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        owner = OTHER
        for frame in reversed(stack.split(";")):
            name = part_of(frame)
            if name is not None:
                owner = name
                break
        parts[owner] += int(count)
    return parts


def record(pid: int, out: Path, fmt: str, seconds: float, rate: int) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed (pip install py-spy: it is in the dev extra)")
    duration = str(max(1, round(seconds)))
    options = [
        "--pid",
        str(pid),
        "--duration",
        duration,
        "--rate",
        str(rate),
        "--format",
        fmt,
        "--output",
        str(out),
        "--gil",
    ]
    return subprocess.Popen(
        [py_spy, "record", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def profile_load(url: str, pid: int, model: str, target: str, name: str, args: argparse.Namespace) -> dict:
    """Run load ``name`` against ``url`` twice, py-spy attached to ``pid``: a flame graph, then folded stacks.
    Returns the parts' CPU per request (and per chunk, for streams) from the folded run, in microseconds."""
    spec = LOADS[name]
    result: dict = {}
    for fmt, path in (("flamegraph", args.out / f"{target}-{name}.svg"), ("raw", args.out / f"{target}-{name}.folded")):
        spy = record(pid, path, fmt, args.seconds, args.rate)
        # The load outlasts the recording by a second, so every sample falls under load.
        run = await load(url, model, seconds=args.seconds + 1.0, pid=pid, auth=BENCH_KEY, **spec)  # type: ignore[arg-type]
        _, err = spy.communicate(timeout=60)
        if spy.returncode != 0 or not path.exists():
            raise SystemExit(f"py-spy ({fmt}) failed: {err.decode(errors='replace')}")
        if fmt != "raw":
            continue
        samples = attribute(path.read_text())
        if not args.keep_folded:
            path.unlink()
        # Requests and chunks over the recorded seconds only: the load ran a second longer.
        per_s = run.requests / run.seconds if run.seconds else 0.0
        chunks_per_s = run.chunks / run.seconds if run.seconds else 0.0
        recorded_s = max(1, round(args.seconds))
        unit = per_s * recorded_s  # requests in the recorded window
        result = {
            "samples": sum(samples.values()),
            "requests": run.requests,
            "chunks": run.chunks,
            "errors": run.errors,
            "cpu_ms_per_request": round(run.cpu_s / run.requests * 1e3, 3) if run.cpu_s and run.requests else None,
            # A sample is 1/rate s of the GIL held; over the requests of the recorded window: us per request.
            "us_per_request": {
                part: round(count / args.rate / unit * 1e6, 1) for part, count in samples.most_common() if unit
            },
        }
        if spec["stream"] and chunks_per_s:
            result["us_per_chunk"] = {
                part: round(count / args.rate / (chunks_per_s * recorded_s) * 1e6, 2)
                for part, count in samples.most_common()
            }
    return result


def report(results: dict) -> None:
    for name in LOADS:
        key = "us_per_chunk" if LOADS[name]["stream"] else "us_per_request"
        by_target = {target: found[name] for target, found in results["targets"].items()}
        table = Table(title=f"{name}: GIL-held CPU {key.replace('_', ' ')} by part (py-spy, {results['rate']} Hz)")
        table.add_column("part")
        for target in by_target:
            table.add_column(target, justify="right")
        parts = [part for part, _ in PARTS] + [OTHER]
        for part in parts:
            values = [by_target[target][key].get(part) for target in by_target]
            if any(values):
                table.add_row(part, *(f"{v:.1f}" if v else "" for v in values))
        table.add_row("total", *(f"{sum(by_target[target][key].values()):.1f}" for target in by_target), style="bold")
        console.print(table)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    upstream_proc = None
    if args.upstream:
        upstream = args.upstream.rstrip("/")
    else:
        upstream_proc, upstream = start_llama()
    try:
        model = asyncio.run(first_model(upstream))
        gateway = gateway_cmd(upstream, "--no-control", "--initial-limit", "64", "--max-queue", "20000")
        targets = {
            "floor": ([sys.executable, str(ROOT / "bench" / "floor_proxy.py"), upstream], None),
            "gateway": (gateway, TENANTS_ENV),
        }
        results: dict = {
            "command": "python -m bench.profile " + " ".join(sys.argv[1:] if argv is None else argv),
            "gateway": " ".join(gateway[1:]),
            "rate": args.rate,
            "seconds": args.seconds,
            "targets": {},
        }
        for target, (cmd, env) in targets.items():
            proc, url = start(cmd, LISTENING, env=env)
            try:
                results["targets"][target] = {
                    name: asyncio.run(profile_load(url, proc.pid, model, target, name, args)) for name in LOADS
                }
            finally:
                proc.stop()
    finally:
        if upstream_proc is not None:
            upstream_proc.stop()
    report(results)
    write_json(args.out / "profile.json", results, indent=2)
    console.print(f"wrote {args.out}: floor-*.svg, gateway-*.svg, profile.json")


if __name__ == "__main__":
    main()
