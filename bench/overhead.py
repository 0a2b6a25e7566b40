"""What the gateway costs: the same load direct, through nginx, through the bare stack and through the
gateway, interleaved in one run.

    .venv/bin/python -m bench.overhead                     # real llama-server, near-free model
    .venv/bin/python -m bench.overhead --upstream URL      # any OpenAI-compatible server
    .venv/bin/python -m bench.overhead --compare 6dae93d   # this tree's gateway beside that commit's
    .venv/bin/python -m bench.overhead --quick             # a smoke run: every phase and figure, in seconds

Configurations, each in front of the same upstream:
  * direct: the load generator talks to the upstream itself;
  * nginx: the C floor (``proxy_buffering off``, keep-alive upstream), when an ``nginx`` binary is installed;
  * pump: ``bench/pump_floor.py``, a TCP byte pump on uvloop with no HTTP at all: the least any Python proxy
    spends on this machine (its clients close streamed connections, as the direct client does);
  * floor: ``bench/floor_proxy.py``, a bare ASGI pass-through on the gateway's own parts (uvicorn, httptools,
    uvloop, aiohttp) with nothing of the gateway: what any proxy on this stack costs on this machine;
  * gateway: ``sweetspot serve --no-control`` with a limit above the load;
  * floor-granian and gateway-granian, when granian is installed (the ``bench`` extra): the floor's app and the
    gateway's app under granian instead of uvicorn (``bench/floor_proxy.py --server granian``), the server
    being all that differs; gateway-granian has none of the gateway's front door (measurement only). The
    report adds their CPU over uvicorn's and the 25% rule for adopting granian (docs/performance.md);
  * gateway@SHA, with ``--compare REF``: the same, run from REF checked out into a temporary git worktree
    (by this interpreter, the worktree first on ``PYTHONPATH``), so a change is measured before and after in
    one run; the report adds the ratio of this tree's gateway to it (``compare`` in the JSON).

Phases (each round runs every configuration once, in an order that rotates per round, so drift hits all):
  * latency at concurrency 1: added TTFT p50/p99 (streamed) and added E2E p50 (non-streamed)
  * non-streamed requests/s at concurrency 32, and the gateway's CPU per request
  * streamed tokens/s at concurrency 8, and the gateway's CPU per streamed chunk
  * 5,000 connected clients, most of them queued: the gateway's resident memory (its connection cap,
    ``max_connections``, raised above them for the phase)
The upstream should be near-free (a tiny model) so the proxy's own CPU decides; with a real model the
ratios approach 1.0 and say nothing. Results: a rich table, and JSON with ``--json PATH``.
The CPU figures are each proxy process's user + system time over the run (its child processes' included:
granian's worker), divided by its requests or chunks: a streamed phase's "per chunk" therefore includes each
request's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

from bench._http import BenchError, admin_headers, dig, get_json
from bench._json import write_json
from bench._nginx import start_nginx
from bench._procs import ROOT, cpu_seconds, gateway_cmd, rss_mb, start
from bench._quick import add_quick, parse
from gateway.common.processes import LISTENING, RunningProcess
from gateway.common.resend import resend_if_stale
from gateway.server.upstream.upstream_client import STALE_RETRIES

console = Console(width=None if sys.stdout.isatty() else 150)

#: The gateway is measured as production runs it: tenants identified by their keys (two, one of them the load's),
#: the access log on (the default), every default feature on. Every target gets the same Authorization header,
#: so the bytes on the wire are the same; only the gateway reads it.
BENCH_KEY = "bench-key-a"
TENANTS_ENV = {
    "SWEETSPOT_TENANTS": json.dumps(
        [
            {"name": "team-a", "api_keys": [BENCH_KEY], "weight": 1},
            {"name": "team-b", "api_keys": ["bench-key-b"], "weight": 2, "max_inflight": 1000},
        ]
    )
}


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
    return ordered[min(round(q / 100 * (len(ordered) - 1)), len(ordered) - 1)]


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
    auth: str | None = BENCH_KEY,
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
        headers = {"Connection": "close"} if stream and close_streams else {}
        if auth:
            headers["Authorization"] = f"Bearer {auth}"
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
    auth: str | None = BENCH_KEY,
) -> Run:
    run = Run()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await one(session, url, model, stream, max_tokens, Run(), close_streams, auth)  # warm the connection pool
        deadline = time.perf_counter() + seconds
        cpu0 = tree_cpu_seconds(pid) if pid else None

        async def client() -> None:
            while time.perf_counter() < deadline:
                await one(session, url, model, stream, max_tokens, run, close_streams, auth)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - t0
        if pid and cpu0 is not None:
            run.cpu_s = tree_cpu_seconds(pid) - cpu0
    return run


async def memory_under_queue(url: str, model: str, pid: int, clients: int) -> dict:
    """Open ``clients`` streaming requests against a gateway whose limit is small: most queue.

    The queue depth is read from ``/state`` on a connection of its own (the clients hold theirs). Requests the
    gateway refused are counted in the figures (``errors``), and the run stops with the reason when the queue
    does not fill (to 90% of the clients within 60 s, or before a tenth of them have failed)."""
    connector = aiohttp.TCPConnector(limit=0)
    run = Run()
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as probe,
    ):
        base_rss = rss_mb(pid)
        tasks = [asyncio.create_task(one(session, url, model, True, 256, run)) for _ in range(clients)]
        try:
            depth, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 60:
                await asyncio.sleep(0.5)
                state = await get_json(probe, f"{url}/state", headers=admin_headers())
                depth = dig(state, "queue", "depth", what=f"GET {url}/state")
                if depth >= clients * 0.9 or run.errors > clients * 0.1:
                    break
            peak = rss_mb(pid)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    if depth < clients * 0.9:
        raise BenchError(
            f"memory phase: {depth} of {clients} clients queued after {time.perf_counter() - t0:.0f} s "
            f"(requests failed: {run.errors}, {run.error_kinds or 'none'}): the figure would not be for {clients}"
        )
    return {
        "clients": clients,
        "queued": depth,
        "rss_idle_mb": round(base_rss, 1),
        "rss_mb": round(peak, 1),
        "errors": run.errors,
        "error_kinds": run.error_kinds,
    }


async def first_model(url: str) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        models = await get_json(session, f"{url}/v1/models")
    return dig(models, "data", 0, "id", what=f"GET {url}/v1/models")


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

#: The hot path's budgets against the floor (``bench/floor_proxy.py``) measured in the same run (docs/performance.md):
#: (phase, figure, how the gateway's figure is set against the floor's, the bound).
BUDGETS = (
    ("plain_c32", "cpu_ms_per_request", "ratio", 1.5),
    ("stream_c8", "cpu_us_per_chunk", "ratio", 1.1),
    ("latency_stream_c1", "added_ttft_p50_ms", "difference", 0.5),
)
#: And the gateway's resident memory with the memory phase's clients connected, most of them queued.
MEMORY_BUDGET_MB = 200.0

# The issue's targets for the gateway, checked in the report.
TARGETS = {
    "added_ttft_p50_ms": 1.5,
    "cpu_ms_per_request": 1.5,
    "rps_ratio": 0.6,
    "tokens_ratio": 0.9,
    "cpu_us_per_chunk": 50.0,
    "rss_mb": 300.0,
}


#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py): every phase and figure, in seconds.
QUICK = {"seconds": 0.5, "rounds": 1, "peers": False, "clients": 300}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", help="OpenAI-compatible base URL (default: start llama-server)")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each measured run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each configuration per phase")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per streamed request")
    parser.add_argument("--clients", type=int, default=5000, help="connected clients for the memory phase")
    parser.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also nginx (when installed), the pump and the floor; --no-peers: direct and the gateway(s) only",
    )
    parser.add_argument(
        "--phases",
        default=",".join([*PHASES, "memory"]),
        help=f"comma-separated subset of {', '.join([*PHASES, 'memory'])} (default: all)",
    )
    parser.add_argument(
        "--compare",
        metavar="REF",
        action="append",
        default=[],
        help="also measure the gateway of git REF (checked out into a temporary worktree), beside this one; "
        "repeat it to measure several refs in the same run (each cut of a series beside the one before)",
    )
    add_quick(parser, QUICK)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parse(parser, argv)
    args.phases = [name.strip() for name in args.phases.split(",") if name.strip()]
    unknown = set(args.phases) - {*PHASES, "memory"}
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    return args


@dataclass
class Gateway:
    """How to start one gateway under test: its name in the report, its command line, where it runs."""

    name: str
    cmd: Callable[..., list[str]]  # (upstream, *extra) -> command line
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def start(self, upstream: str, *extra: str, env: dict[str, str] | None = None) -> RunningProcess:
        proc, _ = start(self.cmd(upstream, *extra), LISTENING, cwd=self.cwd, env={**self.env, **(env or {})})
        return proc


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


@contextmanager
def ref_gateway(ref: str) -> Iterator[tuple[Gateway, dict[str, str]]]:
    """The gateway of git ``ref``: checked out (detached) into a temporary worktree, removed afterwards, and run
    from there by this interpreter (the same virtual environment) with the worktree first on ``PYTHONPATH``.
    Yields it and what it is (the ref, its commit)."""
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    short = git("rev-parse", "--short", commit)
    tmp = Path(tempfile.mkdtemp(prefix=f"sweetspot-{short}-"))
    tree = tmp / "tree"
    git("worktree", "add", "--detach", str(tree), commit)
    try:
        if (tree / "gateway" / "__main__.py").is_file():
            entry = ["-m", "gateway"]
        elif (tree / "gateway" / "cli" / "__init__.py").is_file():
            entry = ["-c", "from gateway.cli import main; main()"]
        else:
            raise BenchError(f"{ref} ({short}) has neither gateway/__main__.py nor gateway/cli/__init__.py")
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)}
        # This interpreter's environment has this checkout installed (editable): make sure the worktree wins.
        found = subprocess.run(
            [sys.executable, "-c", "import gateway; print(gateway.__file__)"],
            cwd=tree,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        if not found.stdout.strip().startswith(str(tree)):
            raise BenchError(f"the worktree of {ref} imports gateway from {found.stdout.strip()}: {found.stderr}")

        def cmd(upstream: str, *extra: str) -> list[str]:
            return [sys.executable, *entry, "serve", "--upstream", upstream, "--port", "0", *extra]

        yield Gateway(f"gateway@{short}", cmd, cwd=tree, env=env), {"ref": ref, "commit": commit}
    finally:
        removed = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True, text=True
        )
        shutil.rmtree(tmp, ignore_errors=True)
        if removed.returncode != 0:
            console.print(
                f"[yellow]git worktree remove {tree}: {removed.stderr.strip()} (`git worktree prune` forgets it)"
                "[/yellow]"
            )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    raise_fd_limit(args.clients)

    with ExitStack() as stack:
        gateways = [Gateway("gateway", gateway_cmd)]
        compared: list[dict[str, str]] = []
        for ref in args.compare:
            other, what = stack.enter_context(ref_gateway(ref))
            gateways.append(other)
            compared.append({**what, "name": other.name})
        if args.upstream:
            upstream = args.upstream.rstrip("/")
        else:
            upstream_proc, upstream = start_llama()
            stack.callback(upstream_proc.stop)
        results = measure_all(stack, upstream, gateways, args)
        if compared:
            results["compares"] = [{**what, "ratios": ratios(results, what["name"])} for what in compared]
            results["compare"] = results["compares"][0]  # the first, where one ref is compared
        if "floor" in results["proxies"]:
            results["budgets"] = budgets(results)
    report(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        # A phase without streamed requests has no TTFT: NaN in Python, null in JSON (NaN is not JSON).
        write_json(args.json, results, indent=2)
        console.print(f"wrote {args.json}")


def measure_all(stack: ExitStack, upstream: str, gateways: list[Gateway], args: argparse.Namespace) -> dict:
    """Start the proxies (stopped by ``stack``), run the phases, then the memory phase gateway by gateway."""
    proxies: dict[str, tuple[str, int]] = {}  # name -> (url, pid whose CPU is measured)
    if args.peers:
        nginx = start_nginx(upstream)
        if nginx is None:
            console.print(
                "[yellow]nginx is not installed: measured without it (apt-get install nginx-light adds it)[/yellow]"
            )
        else:
            proc, url, tmp = nginx
            stack.callback(tmp.cleanup)
            stack.callback(proc.stop)
            proxies["nginx"] = (url, proc.pid)
        for name, script in (("pump", "pump_floor.py"), ("floor", "floor_proxy.py")):
            proc, url = start([sys.executable, str(ROOT / "bench" / script), upstream], LISTENING)
            stack.callback(proc.stop)
            proxies[name] = (url, proc.pid)
    for gateway in gateways:
        proc = gateway.start(upstream, "--no-control", "--initial-limit", "64", "--max-queue", "20000", env=TENANTS_ENV)
        stack.callback(proc.stop)
        proxies[gateway.name] = (proc.url, proc.pid)
    if args.peers:
        proxies.update(start_granian_peers(stack, upstream))
    results = asyncio.run(bench(upstream, proxies, args))
    if "memory" in args.phases:
        # The gateway refuses connections past max_connections (4,096 by default) with a 503: raised above the
        # clients, or the phase measures refusals (and /state, asked on a connection of its own, is refused).
        env = {**TENANTS_ENV, "SWEETSPOT_MAX_CONNECTIONS": str(args.clients + 1024)}
        extra = ("--no-control", "--initial-limit", "4", "--max-queue", "20000", "--queue-timeout-s", "600")
        memory: dict[str, dict] = {}
        for gateway in gateways:
            with gateway.start(upstream, *extra, env=env) as proc:
                memory[gateway.name] = asyncio.run(
                    memory_under_queue(proc.url, results["model"], proc.pid, args.clients)
                )
            console.print(f"[dim]memory, {gateway.name}: {memory[gateway.name]}[/dim]")
        results["memory"] = memory["gateway"]
        if len(gateways) > 1:
            results["memory_by_gateway"] = memory
    if GRANIAN_PAIRS[0][0] in proxies:
        results["granian"] = granian_ratios(results)
    return results


#: The figures ``--compare`` sets side by side, as this gateway's over the other's.
COMPARED = (
    "rps",
    "tokens_per_s",
    "added_ttft_p50_ms",
    "added_ttft_p99_ms",
    "added_e2e_p50_ms",
    "cpu_ms_per_request",
    "cpu_us_per_chunk",
)


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    """``mine / theirs``; None unless both are positive (an added latency at or below zero is noise, and a
    ratio of it means nothing)."""
    if mine is None or theirs is None or not (mine > 0 and theirs > 0):  # NaN fails both comparisons
        return None
    return round(mine / theirs, 3)


#: The CPU figures whose ratio is also given round by round (``KEY_by_round``).
PAIRED_BY_ROUND = ("cpu_ms_per_request", "cpu_us_per_chunk")


def paired_by_round(mine: list[float | None], theirs: list[float | None]) -> list[float | None]:
    """``mine / theirs`` for the runs of each round: the two configurations ran next to each other, so
    the spread of these ratios is the noise a ratio of the totals has to stand out from."""
    return [_ratio(m, t) for m, t in zip(mine, theirs, strict=False)]


def ratios(results: dict, other: str) -> dict[str, dict]:
    """Per phase, ``gateway``'s figure over ``other``'s (below 1: less time or CPU, or fewer requests/s), and
    for the CPU figures the same ratio round by round."""
    out: dict[str, dict] = {}
    for phase, figures in results["phases"].items():
        mine, theirs = figures["gateway"], figures[other]
        out[phase] = {key: _ratio(mine[key], theirs[key]) for key in COMPARED}
        for key in PAIRED_BY_ROUND:
            rounds = paired_by_round(mine.get(f"{key}_by_round", []), theirs.get(f"{key}_by_round", []))
            if any(r is not None for r in rounds):
                out[phase][f"{key}_by_round"] = rounds
    if "memory_by_gateway" in results:
        mine, theirs = results["memory_by_gateway"]["gateway"], results["memory_by_gateway"][other]
        out["memory"] = {
            "rss_mb": _ratio(mine["rss_mb"], theirs["rss_mb"]),
            "rss_growth_mb": _ratio(mine["rss_mb"] - mine["rss_idle_mb"], theirs["rss_mb"] - theirs["rss_idle_mb"]),
        }
    return out


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
    # Each run's own figure too: --compare pairs them round by round, which shows how far runs of one round
    # spread (the machine's noise) beside the ratio of the totals.
    by_round = {
        "cpu_ms_per_request_by_round": [_per(r.cpu_s, r.requests, 1e3, 3) for r in proxied],
        "cpu_us_per_chunk_by_round": [_per(r.cpu_s, r.chunks, 1e6, 1) for r in proxied],
    }
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
        **by_round,
    }


def _per(cpu_s: float | None, count: int, scale: float, digits: int) -> float | None:
    return round((cpu_s or 0.0) / count * scale, digits) if count else None


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


def budgets(results: dict) -> dict[str, dict]:
    """Each budget of :data:`BUDGETS` (and the memory one): the gateway's figure, the floor's, the ratio or
    difference between them, the bound and whether it held. A phase not run is left out."""
    out: dict[str, dict] = {}
    phases = results["phases"]
    for phase, key, how, bound in BUDGETS:
        if phase not in phases:
            continue
        mine, floor = phases[phase]["gateway"][key], phases[phase]["floor"][key]
        if mine is None or floor is None:
            continue
        value = mine / floor if how == "ratio" else mine - floor
        if how == "ratio" and not floor:
            continue
        out[f"{phase}.{key}"] = {
            "gateway": mine,
            "floor": floor,
            how: round(value, 3),
            "bound": bound,
            "met": value <= bound,
        }
    if "memory" in results:
        rss = results["memory"]["rss_mb"]
        out["memory.rss_mb"] = {"gateway": rss, "clients": results["memory"]["clients"], "bound": MEMORY_BUDGET_MB}
        out["memory.rss_mb"]["met"] = rss <= MEMORY_BUDGET_MB
    return out


def report_budgets(found: dict[str, dict]) -> None:
    table = Table(title="the hot path's budgets against the floor, this run (docs/performance.md)")
    for column in ("figure", "gateway", "floor", "gateway vs floor", "budget", ""):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for figure, budget in found.items():
        if "ratio" in budget:
            versus, bound = f"{budget['ratio']:.2f}x", f"<= {budget['bound']}x"
        elif "difference" in budget:
            versus, bound = f"{budget['difference']:+.2f}", f"<= +{budget['bound']}"
        else:
            versus, bound = f"{budget['clients']} clients", f"<= {budget['bound']:g} MB"
        verdict = "met" if budget["met"] else "[bold red]missed[/bold red]"
        table.add_row(figure, str(budget["gateway"]), str(budget.get("floor", "")), versus, bound, verdict)
    console.print(table)


def report(results: dict) -> None:
    phases = results["phases"]
    proxies = results["proxies"]
    compares = results.get("compares") or ([results["compare"]] if "compare" in results else [])
    names = [what["name"] for what in compares]
    title = f"sweetspot overhead vs direct ({results['model']} @ {results['upstream']})"
    for what in compares:
        title += f"; {what['name']} is {what['ref']} ({what['commit'][:12]})"
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("direct", justify="right")
    for proxy in proxies:
        table.add_column(proxy, justify="right")
    for name in names:
        table.add_column(f"gateway / {name}", justify="right")
    table.add_column("gateway target", justify="right")
    blanks = [""] * len(names)

    def ratio_cells(phase: str, key: str) -> list[str]:
        cells = []
        for what in compares:
            value = _ratio(phases[phase]["gateway"][key], phases[phase][what["name"]][key])
            cell = f"{value:.3f}x" if value is not None else ""
            known = [r for r in what["ratios"][phase].get(f"{key}_by_round", []) if r is not None]
            if value is not None and len(known) > 1:
                cell += f" ({min(known):.2f}-{max(known):.2f})"
            cells.append(cell)
        return cells

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
        ratio = ratio_cells(phase, key)
        table.add_row(label, direct, *(f"{v}{unit}" if v is not None else "" for v in values), *ratio, goal)

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
        # The issue's per-chunk target came from a machine where nginx spent ~15 us a chunk: 50 us is 3.3x that.
        per_chunk = {p: phases["stream_c8"][p]["cpu_us_per_chunk"] for p in proxies}
        table.add_row(
            "  CPU per chunk / nginx's",
            "",
            *(
                f"{per_chunk[p] / per_chunk['nginx']:.2f}x" if per_chunk[p] and per_chunk["nginx"] else ""
                for p in proxies
            ),
            *blanks,
            "(issue: 50 / 15 us = 3.3x)",
        )
    errors = {p: sum(phases[ph][p]["errors"] for ph in phases) for p in proxies}
    direct_errors = sum(phases[ph][proxies[0]]["direct_errors"] for ph in phases)
    table.add_row(
        "failed requests, all phases",
        str(direct_errors),
        *(str(errors[p]) for p in proxies),
        *blanks,
        "0",
    )
    if "memory" in results:
        m = results["memory"]
        by_gateway = results.get("memory_by_gateway", {"gateway": m})

        def memory_cell(p: str) -> str:
            if p not in by_gateway:
                return ""
            mine = by_gateway[p]
            failed = f", {mine['errors']} failed" if mine.get("errors") else ""
            return f"{mine['rss_mb']} MB (idle {mine['rss_idle_mb']}{failed})"

        table.add_row(
            f"RSS, {m['clients']} clients ({m['queued']} queued)",
            "",
            *(memory_cell(p) for p in proxies),
            *(
                f"{value:.3f}x" if (value := _ratio(m["rss_mb"], by_gateway.get(name, {}).get("rss_mb"))) else ""
                for name in names
            ),
            f"<= {TARGETS['rss_mb']} MB " + _verdict(m["rss_mb"], TARGETS["rss_mb"], at_least=False),
        )
    console.print(table)
    if "granian" in results:
        report_granian(results["granian"])
    if "budgets" in results:
        report_budgets(results["budgets"])
    for what in compares:
        console.print(
            f"gateway / {what['name']}: this tree's figure over {what['ref']}'s; below 1 is less time, "
            "CPU or memory (and fewer requests or tokens/s); beside a CPU ratio, the range of its round-by-round "
            "ratios: a change inside it is not told apart from the machine's noise"
        )


# --- The floor itself: granian against uvicorn (issue #37 item 4; docs/performance.md) -----------------------

#: (granian's peer, the uvicorn configuration it is compared with).
GRANIAN_PAIRS = (("floor-granian", "floor"), ("gateway-granian", "gateway"))
#: A different server is adopted only if it spends at least this much less CPU per request and per chunk.
GRANIAN_RULE = 0.25
#: granian's figures over uvicorn's: (phase, key) -> label.
GRANIAN_FIGURES = {
    ("plain_c32", "cpu_ms_per_request"): "CPU per request, c=32",
    ("stream_c8", "cpu_us_per_chunk"): "CPU per streamed chunk, c=8",
    ("stream_c8", "cpu_ms_per_request"): "CPU per streamed request, c=8",
    ("latency_stream_c1", "added_ttft_p50_ms"): "TTFT added p50, c=1",
}


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` and of its descendants alive now (granian serves from a worker process,
    a child of the one started); a process without children reads as :func:`cpu_seconds`."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        children.setdefault(parent, []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += cpu_seconds(current)
        except (OSError, IndexError, ValueError):
            continue
        todo += children.get(current, [])
    return total


def granian_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("granian") is not None


def start_granian_peers(stack: ExitStack, upstream: str) -> dict[str, tuple[str, int]]:
    """floor-granian and gateway-granian (stopped by ``stack``), or none, with a note, without granian.

    gateway-granian gets the settings the gateway gets here (no control loop, a limit above the load, the
    bench's tenants) through its ``SWEETSPOT_*`` environment, and serves without the gateway's front door:
    measurement only."""
    if not granian_installed():
        console.print(
            "[yellow]granian is not installed: measured without floor-granian and gateway-granian "
            "(pip install -e '.\\[bench]' adds it)[/yellow]"
        )
        return {}
    script = str(ROOT / "bench" / "floor_proxy.py")
    env = {
        **TENANTS_ENV,
        "SWEETSPOT_CONTROL_ENABLED": "false",
        "SWEETSPOT_INITIAL_LIMIT": "64",
        "SWEETSPOT_MAX_QUEUE": "20000",
    }
    peers: dict[str, tuple[str, int]] = {}
    for name, app in (("floor-granian", "floor"), ("gateway-granian", "gateway")):
        proc, url = start([sys.executable, script, "--server", "granian", "--app", app, upstream], LISTENING, env=env)
        stack.callback(proc.stop)
        peers[name] = (url, proc.pid)
    return peers


def granian_ratios(results: dict) -> dict:
    """Per pair, granian's figure over uvicorn's for :data:`GRANIAN_FIGURES`, and whether the CPU per request
    (c=32) and per chunk (c=8) are both at least :data:`GRANIAN_RULE` lower (None where a phase was not run)."""
    phases = results["phases"]
    out: dict = {"rule": f"adopt only if CPU per request and per chunk are both >= {GRANIAN_RULE:.0%} lower"}
    for mine, theirs in GRANIAN_PAIRS:
        figures = {
            f"{phase}.{key}": _ratio(phases[phase][mine][key], phases[phase][theirs][key])
            for phase, key in GRANIAN_FIGURES
            if phase in phases and mine in phases[phase]
        }
        decisive = [figures.get("plain_c32.cpu_ms_per_request"), figures.get("stream_c8.cpu_us_per_chunk")]
        passes = None if None in decisive else all(r is not None and r <= 1 - GRANIAN_RULE for r in decisive)
        out[f"{mine}/{theirs}"] = {"ratios": figures, "passes_cpu_rule": passes}
    return out


def report_granian(granian: dict) -> None:
    table = Table(title=f"granian over uvicorn, the same app ({granian['rule']}; front-door guarantees aside)")
    table.add_column("measure")
    pairs = [f"{mine}/{theirs}" for mine, theirs in GRANIAN_PAIRS]
    for pair in pairs:
        table.add_column(pair, justify="right")
    for (phase, key), label in GRANIAN_FIGURES.items():
        cells = [granian[pair]["ratios"].get(f"{phase}.{key}") for pair in pairs]
        if any(cell is not None for cell in cells):
            table.add_row(label, *(f"{cell:.3f}x" if cell is not None else "" for cell in cells))
    table.add_row(
        f"CPU {GRANIAN_RULE:.0%} lower on both",
        *({True: "yes", False: "no", None: ""}[granian[pair]["passes_cpu_rule"]] for pair in pairs),
    )
    console.print(table)


if __name__ == "__main__":
    main()
