"""What the gateway costs: the same load direct and through the gateway, interleaved in one run.

    .venv/bin/python bench/overhead.py                     # real llama-server, near-free model
    .venv/bin/python bench/overhead.py --upstream URL      # any OpenAI-compatible server

Phases (each round runs direct, then through the gateway, so drift hits both alike):
  * latency at concurrency 1: added TTFT p50/p99 (streamed) and added E2E p50 (non-streamed)
  * non-streamed requests/s at concurrency 32, and the gateway's CPU per request
  * streamed tokens/s at concurrency 8, and the gateway's CPU per streamed chunk
  * 5,000 connected clients, most of them queued: the gateway's resident memory
The upstream should be near-free (a tiny model) so the proxy's own CPU decides; with a real model the
ratios approach 1.0 and say nothing. Results: a rich table, and JSON with ``--json PATH``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import ROOT, cpu_seconds, gateway_cmd, rss_mb, start, stop  # noqa: E402

console = Console()


@dataclass
class Run:
    requests: int = 0
    errors: int = 0
    chunks: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    cpu_s: float | None = None

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
STALE_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
STALE_RETRIES = 2


async def post(session: aiohttp.ClientSession, url: str, body: dict, headers: dict[str, str] | None = None
               ) -> aiohttp.ClientResponse:
    """POST, resending when the pooled connection turns out to be closed before any byte came back."""
    for attempt in range(STALE_RETRIES + 1):
        try:
            return await session.post(url, json=body, headers=headers)
        except aiohttp.ClientConnectorError:
            raise
        except STALE_ERRORS:
            if attempt == STALE_RETRIES:
                raise
    raise AssertionError("unreachable")


async def one(session: aiohttp.ClientSession, url: str, model: str, stream: bool, max_tokens: int, run: Run,
              close_streams: bool = False) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    t0 = time.perf_counter()  # from the first attempt, as the gateway's resends count in its latency too
    try:
        headers = {"Connection": "close"} if stream and close_streams else None
        async with await post(session, f"{url}/v1/chat/completions", body, headers) as resp:
            if resp.status != 200:
                await resp.read()
                run.errors += 1
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
    except aiohttp.ClientError:
        run.errors += 1
        return
    run.e2e.append(time.perf_counter() - t0)
    run.requests += 1


async def load(url: str, model: str, *, concurrency: int, seconds: float, stream: bool, max_tokens: int,
               pid: int | None, close_streams: bool = False) -> Run:
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
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/v1/models") as resp:
            return (await resp.json())["data"][0]["id"]


def start_llama() -> tuple[object, str]:
    from gateway.testing.llama_process import start_near_free_server

    return start_near_free_server(parallel=32)


def raise_fd_limit(clients: int) -> None:
    """The memory phase holds ``clients`` connections open in this process and as many in the gateway (which
    inherits this process's limits): raise the soft limit on open files to what that needs (many systems
    default to 1024), or stop with the reason before anything starts."""
    import resource

    needed = clients + 1024  # the clients, plus the pools, pipes and files of everything else
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise SystemExit(f"--clients {clients} needs {needed} open files per process, but the hard limit is "
                             f"{hard}: raise it (ulimit -Hn, or LimitNOFILE for a service) or pass fewer --clients")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", help="OpenAI-compatible base URL (default: start llama-server)")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each measured run")
    parser.add_argument("--rounds", type=int, default=2, help="direct/gateway pairs per phase")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per streamed request")
    parser.add_argument("--clients", type=int, default=5000, help="connected clients for the memory phase")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    raise_fd_limit(args.clients)

    upstream_proc = None
    if args.upstream:
        upstream = args.upstream.rstrip("/")
    else:
        upstream_proc, upstream = start_llama()
    gateway_proc, gateway = start(
        gateway_cmd(upstream, "--no-control", "--initial-limit", "64", "--max-queue", "20000"),
        r"listening on (http://\S+)",
    )
    try:
        results = asyncio.run(bench(upstream, gateway, gateway_proc.pid, args))
        memory_proc, memory_url = start(
            gateway_cmd(upstream, "--no-control", "--initial-limit", "4", "--max-queue", "20000",
                        "--queue-timeout-s", "600"),
            r"listening on (http://\S+)",
        )
        try:
            results["memory"] = asyncio.run(
                memory_under_queue(memory_url, results["model"], memory_proc.pid, args.clients))
        finally:
            stop(memory_proc)
    finally:
        stop(gateway_proc)
        if upstream_proc is not None:
            upstream_proc.stop()  # type: ignore[attr-defined]
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


async def bench(upstream: str, gateway: str, pid: int, args: argparse.Namespace) -> dict:
    model = await first_model(upstream)
    phases = {
        "latency_stream_c1": dict(concurrency=1, stream=True, max_tokens=8),
        "latency_plain_c1": dict(concurrency=1, stream=False, max_tokens=1),
        "plain_c32": dict(concurrency=32, stream=False, max_tokens=1),
        "stream_c8": dict(concurrency=8, stream=True, max_tokens=args.max_tokens),
    }
    out: dict = {"model": model, "upstream": upstream, "seconds": args.seconds, "rounds": args.rounds, "phases": {}}
    for name, spec in phases.items():
        direct_runs, gateway_runs = [], []
        for _ in range(args.rounds):
            direct_runs.append(await load(upstream, model, seconds=args.seconds, pid=None, close_streams=True, **spec))
            gateway_runs.append(await load(gateway, model, seconds=args.seconds, pid=pid, **spec))
        out["phases"][name] = summarise(direct_runs, gateway_runs)
        console.print(f"[dim]{name}: {out['phases'][name]}[/dim]")
    return out


def summarise(direct: list[Run], gateway: list[Run]) -> dict:
    def merged(runs: list[Run], attr: str) -> list[float]:
        return [v for run in runs for v in getattr(run, attr)]

    d_rps = statistics.median(r.rps for r in direct)
    g_rps = statistics.median(r.rps for r in gateway)
    d_cps = statistics.median(r.chunks_per_s for r in direct)
    g_cps = statistics.median(r.chunks_per_s for r in gateway)
    g_requests = sum(r.requests for r in gateway)
    g_chunks = sum(r.chunks for r in gateway)
    g_cpu = sum(r.cpu_s or 0.0 for r in gateway)
    return {
        "direct_rps": round(d_rps, 1), "gateway_rps": round(g_rps, 1),
        "rps_ratio": round(g_rps / d_rps, 3) if d_rps else None,
        "direct_tokens_per_s": round(d_cps, 1), "gateway_tokens_per_s": round(g_cps, 1),
        "tokens_ratio": round(g_cps / d_cps, 3) if d_cps else None,
        "added_ttft_p50_ms": round((pct(merged(gateway, "ttft"), 50) - pct(merged(direct, "ttft"), 50)) * 1e3, 2),
        "added_ttft_p99_ms": round((pct(merged(gateway, "ttft"), 99) - pct(merged(direct, "ttft"), 99)) * 1e3, 2),
        "added_e2e_p50_ms": round((pct(merged(gateway, "e2e"), 50) - pct(merged(direct, "e2e"), 50)) * 1e3, 2),
        "gateway_cpu_ms_per_request": round(g_cpu / g_requests * 1e3, 3) if g_requests else None,
        "gateway_cpu_us_per_chunk": round(g_cpu / g_chunks * 1e6, 1) if g_chunks else None,
        "errors": sum(r.errors for r in direct + gateway),
    }


def report(results: dict) -> None:
    phases = results["phases"]
    table = Table(title=f"sweetspot overhead vs direct ({results['model']} @ {results['upstream']})")
    for column in ("measure", "direct", "gateway", "ratio / added", "gateway CPU"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    s1, p1 = phases["latency_stream_c1"], phases["latency_plain_c1"]
    table.add_row("TTFT added, c=1 (p50 / p99)", "", "", f"{s1['added_ttft_p50_ms']} / {s1['added_ttft_p99_ms']} ms", "")
    table.add_row("E2E added, c=1 non-streamed (p50)", "", "", f"{p1['added_e2e_p50_ms']} ms",
                  f"{p1['gateway_cpu_ms_per_request']} ms/req")
    p32 = phases["plain_c32"]
    table.add_row("non-streamed req/s, c=32", f"{p32['direct_rps']}", f"{p32['gateway_rps']}", f"{p32['rps_ratio']}x",
                  f"{p32['gateway_cpu_ms_per_request']} ms/req")
    s8 = phases["stream_c8"]
    table.add_row("streamed tokens/s, c=8", f"{s8['direct_tokens_per_s']}", f"{s8['gateway_tokens_per_s']}",
                  f"{s8['tokens_ratio']}x", f"{s8['gateway_cpu_us_per_chunk']} us/chunk")
    if "memory" in results:
        m = results["memory"]
        table.add_row(f"RSS with {m['clients']} clients ({m['queued']} queued)", "", f"{m['rss_mb']} MB",
                      f"idle {m['rss_idle_mb']} MB", "")
    console.print(table)


if __name__ == "__main__":
    main()
