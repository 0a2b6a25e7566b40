"""What the gateway costs: the same load direct, through nginx, through the bare stack and through the
gateway, interleaved in one run.

    .venv/bin/python -m bench.overhead                     # real llama-server, near-free model
    .venv/bin/python -m bench.overhead --upstream URL      # any OpenAI-compatible server

Configurations, each in front of the same upstream:
  * direct: the load generator talks to the upstream itself;
  * nginx: the C floor (``proxy_buffering off``, keep-alive upstream), when an ``nginx`` binary is installed;
  * pump: ``bench/pump_floor.py``, a TCP byte pump on uvloop with no HTTP at all: the least any Python proxy
    spends on this machine (its clients close streamed connections, as the direct client does);
  * floor: ``bench/floor_proxy.py``, a bare ASGI pass-through on the gateway's own parts (uvicorn, httptools,
    uvloop, aiohttp) with nothing of the gateway: what any proxy on this stack costs on this machine;
  * gateway: ``sweetspot serve --no-control`` with a limit above the load.

Phases (each round runs every configuration once, in an order that rotates per round, so drift hits all):
  * latency at concurrency 1: added TTFT p50/p99 (streamed) and added E2E p50 (non-streamed)
  * non-streamed requests/s at concurrency 32, and the gateway's CPU per request
  * streamed tokens/s at concurrency 8, and the gateway's CPU per streamed chunk
  * 5,000 connected clients, most of them queued: the gateway's resident memory
The upstream should be near-free (a tiny model) so the proxy's own CPU decides; with a real model the
ratios approach 1.0 and say nothing. Results: a rich table, and JSON with ``--json PATH``.
The CPU figures are each proxy process's user + system time over the run, divided by its requests or
chunks: a streamed phase's "per chunk" therefore includes each request's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

from bench._nginx import start_nginx
from bench._procs import ROOT, cpu_seconds, gateway_cmd, rss_mb, start
from gateway.common.processes import LISTENING, RunningProcess
from gateway.common.resend import resend_if_stale
from gateway.server.upstream.upstream_client import STALE_RETRIES

console = Console(width=None if sys.stdout.isatty() else 150)


@dataclass
class Run:
    requests: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)  # HTTP status or exception name -> count
    chunks: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    cpu_s: float | None = None

    def failed(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.seconds if self.seconds else 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(round(q / 100 * (len(ordered) - 1))), len(ordered) - 1)]


# llama-server closes its connection after every streamed reply while announcing keep-alive, so a pooled
# connection can be dead before the request is written. The gateway sends streamed requests upstream with
# ``Connection: close`` (so those connections are never pooled), and resends a request whose pooled connection
# died before any byte came back; the direct client does the same (``close_streams``), or half of its streamed
# requests fail and the comparison measures that instead of the proxy.
async def post(
    session: aiohttp.ClientSession, url: str, body: dict, headers: dict[str, str] | None = None
) -> aiohttp.ClientResponse:
    """POST, resending (as the gateway does) when the pooled connection turns out to be dead."""
    return await resend_if_stale(lambda: session.post(url, json=body, headers=headers), resends=STALE_RETRIES)


async def one(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    stream: bool,
    max_tokens: int,
    run: Run,
    close_streams: bool = False,
) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    t0 = time.perf_counter()  # from the first attempt, as the gateway's resends count in its latency too
    try:
        headers = {"Connection": "close"} if stream and close_streams else None
        async with await post(session, f"{url}/v1/chat/completions", body, headers) as resp:
            if resp.status != 200:
                await resp.read()
                run.failed(str(resp.status))
                return
            if not stream:
                await resp.read()
            else:
                first = None
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        if first is None:
                            first = time.perf_counter()
                            run.ttft.append(first - t0)
                        run.chunks += 1
    except (TimeoutError, aiohttp.ClientError) as exc:
        run.failed(type(exc).__name__)
        return
    run.e2e.append(time.perf_counter() - t0)
    run.requests += 1


async def load(
    url: str,
    model: str,
    *,
    concurrency: int,
    seconds: float,
    stream: bool,
    max_tokens: int,
    pid: int | None,
    close_streams: bool = False,
) -> Run:
    run = Run()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await one(session, url, model, stream, max_tokens, Run(), close_streams)  # warm the connection pool
        deadline = time.perf_counter() + seconds
        cpu0 = cpu_seconds(pid) if pid else None

        async def client() -> None:
            while time.perf_counter() < deadline:
                await one(session, url, model, stream, max_tokens, run, close_streams)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - t0
        if pid:
            run.cpu_s = cpu_seconds(pid) - cpu0
    return run


async def memory_under_queue(url: str, model: str, pid: int, clients: int) -> dict:
    """Open ``clients`` streaming requests against a gateway whose limit is small: most queue."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        base_rss = rss_mb(pid)
        tasks = [asyncio.create_task(one(session, url, model, True, 256, Run())) for _ in range(clients)]
        depth, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 60:
            await asyncio.sleep(0.5)
            async with session.get(f"{url}/state") as resp:
                depth = (await resp.json())["queue"]["depth"]
            if depth >= clients * 0.9:
                break
        peak = rss_mb(pid)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"clients": clients, "queued": depth, "rss_idle_mb": round(base_rss, 1), "rss_mb": round(peak, 1)}


async def first_model(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/models") as resp:
        return (await resp.json())["data"][0]["id"]


def start_llama() -> tuple[RunningProcess, str]:
    from testbed.llama_process import start_near_free_server

    # Direct clients, nginx's, the floor's and the gateway's pools all keep connections to this one server, each
    # holding one of its HTTP threads while idle: with the default (slots + 2) the next configuration's
    # requests wait for the previous one's idle connections to time out.
    return start_near_free_server(parallel=32, http_threads=256)


def raise_fd_limit(clients: int) -> None:
    """The memory phase holds ``clients`` connections open in this process and as many in the gateway (which
    inherits this process's limits): raise the soft limit on open files to what that needs (many systems
    default to 1024), or stop with the reason before anything starts."""
    import resource

    needed = clients + 1024  # the clients, plus the pools, pipes and files of everything else
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise SystemExit(
                f"--clients {clients} needs {needed} open files per process, but the hard limit is "
                f"{hard}: raise it (ulimit -Hn, or LimitNOFILE for a service) or pass fewer --clients"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


# The measured phases: load shape per phase (max_tokens None: --max-tokens).
PHASES: dict[str, dict] = {
    "latency_stream_c1": dict(concurrency=1, stream=True, max_tokens=8),
    "latency_plain_c1": dict(concurrency=1, stream=False, max_tokens=1),
    "plain_c32": dict(concurrency=32, stream=False, max_tokens=1),
    "stream_c8": dict(concurrency=8, stream=True, max_tokens=None),
}

# Whose clients close streamed connections: the direct client's (llama-server closes them anyway, see
# ``post``) and the pump's (it cannot tell where a streamed reply ends).
CLOSE_STREAMS = {"direct", "pump"}

# The targets for the gateway, checked in the report.
TARGETS = {
    "added_ttft_p50_ms": 1.5,
    "cpu_ms_per_request": 1.5,
    "rps_ratio": 0.6,
    "tokens_ratio": 0.9,
    "cpu_us_per_chunk": 50.0,
    "rss_mb": 300.0,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", help="OpenAI-compatible base URL (default: start llama-server)")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each measured run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each configuration per phase")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per streamed request")
    parser.add_argument("--clients", type=int, default=5000, help="connected clients for the memory phase")
    parser.add_argument("--no-peers", action="store_true", help="direct and gateway only (no nginx, no floor)")
    parser.add_argument(
        "--phases",
        default=",".join([*PHASES, "memory"]),
        help=f"comma-separated subset of {', '.join([*PHASES, 'memory'])} (default: all)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    args.phases = [name.strip() for name in args.phases.split(",") if name.strip()]
    unknown = set(args.phases) - {*PHASES, "memory"}
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    raise_fd_limit(args.clients)

    upstream_proc = None
    if args.upstream:
        upstream = args.upstream.rstrip("/")
    else:
        upstream_proc, upstream = start_llama()
    cleanup: list = []
    proxies: dict[str, tuple[str, int]] = {}  # name -> (url, pid whose CPU is measured)
    try:
        if not args.no_peers:
            nginx = start_nginx(upstream)
            if nginx is None:
                console.print(
                    "[yellow]nginx is not installed: measured without it (apt-get install nginx-light adds it)[/yellow]"
                )
            else:
                proc, url, tmp = nginx
                cleanup += [proc.stop, tmp.cleanup]
                proxies["nginx"] = (url, proc.pid)
            proc, url = start([sys.executable, str(ROOT / "bench" / "pump_floor.py"), upstream], LISTENING)
            cleanup.append(proc.stop)
            proxies["pump"] = (url, proc.pid)
            proc, url = start([sys.executable, str(ROOT / "bench" / "floor_proxy.py"), upstream], LISTENING)
            cleanup.append(proc.stop)
            proxies["floor"] = (url, proc.pid)
        proc, url = start(
            gateway_cmd(upstream, "--no-control", "--initial-limit", "64", "--max-queue", "20000"), LISTENING
        )
        cleanup.append(proc.stop)
        proxies["gateway"] = (url, proc.pid)
        results = asyncio.run(bench(upstream, proxies, args))
        if "memory" in args.phases:
            memory_proc, memory_url = start(
                gateway_cmd(
                    upstream, "--no-control", "--initial-limit", "4", "--max-queue", "20000", "--queue-timeout-s", "600"
                ),
                LISTENING,
            )
            try:
                results["memory"] = asyncio.run(
                    memory_under_queue(memory_url, results["model"], memory_proc.pid, args.clients)
                )
            finally:
                memory_proc.stop()
    finally:
        for step in reversed(cleanup):
            step()
        if upstream_proc is not None:
            upstream_proc.stop()
    report(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        # A phase without streamed requests has no TTFT: NaN in Python, null in JSON (NaN is not JSON).
        args.json.write_text(json.dumps(_nan_to_none(results), indent=2, allow_nan=False) + "\n")
        console.print(f"wrote {args.json}")


def _nan_to_none(value: object) -> object:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {key: _nan_to_none(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(item) for item in value]
    return value


async def bench(upstream: str, proxies: dict[str, tuple[str, int]], args: argparse.Namespace) -> dict:
    model = await first_model(upstream)
    phases = {
        name: {**spec, "max_tokens": spec["max_tokens"] or args.max_tokens}
        for name, spec in PHASES.items()
        if name in args.phases
    }
    out: dict = {
        "model": model,
        "upstream": upstream,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "proxies": list(proxies),
        "phases": {},
    }
    names = ["direct", *proxies]
    for name, spec in phases.items():
        runs: dict[str, list[Run]] = {n: [] for n in names}
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for target in names[shift:] + names[:shift]:
                url, pid = (upstream, None) if target == "direct" else proxies[target]
                runs[target].append(
                    await load(url, model, seconds=args.seconds, pid=pid, close_streams=target in CLOSE_STREAMS, **spec)
                )
        out["phases"][name] = {proxy: summarise(runs["direct"], runs[proxy]) for proxy in proxies}
        console.print(f"[dim]{name}: {out['phases'][name]}[/dim]")
    return out


def summarise(direct: list[Run], proxied: list[Run]) -> dict:
    def merged(runs: list[Run], attr: str) -> list[float]:
        return [v for run in runs for v in getattr(run, attr)]

    d_rps = statistics.median(r.rps for r in direct)
    p_rps = statistics.median(r.rps for r in proxied)
    d_cps = statistics.median(r.chunks_per_s for r in direct)
    p_cps = statistics.median(r.chunks_per_s for r in proxied)
    requests = sum(r.requests for r in proxied)
    chunks = sum(r.chunks for r in proxied)
    cpu = sum(r.cpu_s or 0.0 for r in proxied)
    return {
        "direct_rps": round(d_rps, 1),
        "rps": round(p_rps, 1),
        "rps_ratio": round(p_rps / d_rps, 3) if d_rps else None,
        "direct_tokens_per_s": round(d_cps, 1),
        "tokens_per_s": round(p_cps, 1),
        "tokens_ratio": round(p_cps / d_cps, 3) if d_cps else None,
        "added_ttft_p50_ms": round((pct(merged(proxied, "ttft"), 50) - pct(merged(direct, "ttft"), 50)) * 1e3, 2),
        "added_ttft_p99_ms": round((pct(merged(proxied, "ttft"), 99) - pct(merged(direct, "ttft"), 99)) * 1e3, 2),
        "added_e2e_p50_ms": round((pct(merged(proxied, "e2e"), 50) - pct(merged(direct, "e2e"), 50)) * 1e3, 2),
        "cpu_ms_per_request": round(cpu / requests * 1e3, 3) if requests else None,
        "cpu_us_per_chunk": round(cpu / chunks * 1e6, 1) if chunks else None,
        "errors": sum(r.errors for r in proxied),
        "error_kinds": _merged_kinds(proxied),
        "direct_errors": sum(r.errors for r in direct),
        "direct_error_kinds": _merged_kinds(direct),
    }


def _merged_kinds(runs: list[Run]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for run in runs:
        for kind, count in run.error_kinds.items():
            merged[kind] = merged.get(kind, 0) + count
    return merged


def _verdict(value: float | None, target: float, *, at_least: bool) -> str:
    if value is None:
        return ""
    met = value >= target if at_least else value <= target
    return "met" if met else "[bold red]missed[/bold red]"


def report(results: dict) -> None:
    phases = results["phases"]
    proxies = results["proxies"]
    table = Table(title=f"sweetspot overhead vs direct ({results['model']} @ {results['upstream']})")
    table.add_column("measure")
    table.add_column("direct", justify="right")
    for proxy in proxies:
        table.add_column(proxy, justify="right")
    table.add_column("gateway target", justify="right")

    def row(
        label: str,
        phase: str,
        key: str,
        unit: str,
        target: float | None = None,
        *,
        at_least: bool = False,
        direct_key: str | None = None,
    ) -> None:
        if phase not in phases:  # not run (--phases)
            return
        values = [phases[phase][p][key] for p in proxies]
        direct = f"{phases[phase][proxies[0]][direct_key]}" if direct_key else ""
        goal = ""
        if target is not None:
            goal = f"{'>=' if at_least else '<='} {target}{unit} " + _verdict(
                phases[phase]["gateway"][key], target, at_least=at_least
            )
        table.add_row(label, direct, *(f"{v}{unit}" if v is not None else "" for v in values), goal)

    row("TTFT added p50, streamed c=1", "latency_stream_c1", "added_ttft_p50_ms", " ms", TARGETS["added_ttft_p50_ms"])
    row("TTFT added p99, streamed c=1", "latency_stream_c1", "added_ttft_p99_ms", " ms")
    row("E2E added p50, non-streamed c=1", "latency_plain_c1", "added_e2e_p50_ms", " ms")
    row("non-streamed req/s c=32", "plain_c32", "rps", "", direct_key="direct_rps")
    row("  ratio to direct", "plain_c32", "rps_ratio", "x", TARGETS["rps_ratio"], at_least=True)
    row("  CPU per request", "plain_c32", "cpu_ms_per_request", " ms", TARGETS["cpu_ms_per_request"])
    row("streamed tokens/s c=8", "stream_c8", "tokens_per_s", "", direct_key="direct_tokens_per_s")
    row("  ratio to direct", "stream_c8", "tokens_ratio", "x", TARGETS["tokens_ratio"], at_least=True)
    row("  CPU per streamed chunk", "stream_c8", "cpu_us_per_chunk", " us", TARGETS["cpu_us_per_chunk"])
    row("  CPU per streamed request", "stream_c8", "cpu_ms_per_request", " ms")
    if "stream_c8" in phases and "nginx" in proxies:
        # The per-chunk target came from a machine where nginx spent ~15 us a chunk: 50 us is 3.3x that.
        per_chunk = {p: phases["stream_c8"][p]["cpu_us_per_chunk"] for p in proxies}
        table.add_row(
            "  CPU per chunk / nginx's",
            "",
            *(
                f"{per_chunk[p] / per_chunk['nginx']:.2f}x" if per_chunk[p] and per_chunk["nginx"] else ""
                for p in proxies
            ),
            "(issue: 50 / 15 us = 3.3x)",
        )
    errors = {p: sum(phases[ph][p]["errors"] for ph in phases) for p in proxies}
    direct_errors = sum(phases[ph][proxies[0]]["direct_errors"] for ph in phases)
    table.add_row("failed requests, all phases", str(direct_errors), *(str(errors[p]) for p in proxies), "0")
    if "memory" in results:
        m = results["memory"]
        cells = ["" for _ in proxies[:-1]] + [f"{m['rss_mb']} MB (idle {m['rss_idle_mb']})"]
        table.add_row(
            f"RSS, {m['clients']} clients ({m['queued']} queued)",
            "",
            *cells,
            f"<= {TARGETS['rss_mb']} MB " + _verdict(m["rss_mb"], TARGETS["rss_mb"], at_least=False),
        )
    console.print(table)


if __name__ == "__main__":
    main()
