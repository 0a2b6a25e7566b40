"""Soak: the gateway in front of the simulator at twice its sweet spot for a long time, with a fault a minute.

Proves the production rules that only time shows: nothing admitted is ever lost (every request ends in a
completion or an error the client reads), every permit and queue place comes back, and memory stays flat.
The faults rotate, one a minute: the upstream killed and restarted on its port, a 2x slowdown, an error
storm, a tenth of the clients hanging up mid-stream, and a burst that overflows the queue.

    .venv/bin/python -m bench.soak                              # 10 minutes
    .venv/bin/python -m bench.soak --minutes 3 --json out/soak.json
    .venv/bin/python -m bench.soak --docs docs/soak.md --json docs/soak.json
    .venv/bin/python -m bench.soak --quick                      # a smoke run: every fault, in seconds

The report: requests by ending (completed, error answered, lost: no answer at all), permits in flight and
queue depth at the end, open file descriptors, and the gateway's RSS over time with its growth per 10
minutes after warm-up (a least-squares line through the samples).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench._http import BenchError, admin_headers, dig
from bench._http import get_json as _get_json
from bench._json import write_json
from bench._quick import add_quick, parse
from gateway.common.processes import LISTENING, RunningProcess, free_port, start_process, sweetspot

CHAT = [{"role": "user", "content": "soak"}]
FAULTS = ("restart", "slowdown", "error_storm", "hang_ups", "burst")
WARMUP_S = 120.0
#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py): the five faults, one every 2 s
#: and each for its share of that (a restart's pause, a slowdown, an error storm, hang-ups, a burst), in 15 s
#: (room for a slow restart: the faults run one after the other, and none starts in the last second).
QUICK = {"minutes": 0.25, "clients": 8, "burst": 30, "max_tokens": 32, "time_scale": 4.0, "fault_period_s": 2.0}


@dataclass
class Tally:
    endings: Counter[str] = field(default_factory=Counter)
    hang_up_share: float = 0.0  # clients abort this share of streams after their first chunk


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def one_request(
    session: aiohttp.ClientSession, gw: str, model: str, tally: Tally, rng: random.Random, max_tokens: int
) -> None:
    body = {"model": model, "messages": CHAT, "stream": True, "max_tokens": max_tokens}
    hang_up = rng.random() < tally.hang_up_share
    try:
        async with session.post(f"{gw}/v1/chat/completions", json=body) as response:
            if response.status != 200:
                await response.read()
                tally.endings[f"error_{response.status}"] += 1
                return
            ended = "lost"  # a 200 whose stream ended with neither [DONE] nor an error event
            async for line in response.content:
                if hang_up and line.startswith(b"data:"):
                    tally.endings["hung_up"] += 1
                    return  # leaving the block closes the connection mid-stream
                if line.startswith(b"data: [DONE]"):
                    ended = "completed"
                elif line.startswith(b"data:") and b'"error"' in line:
                    ended = "error_event"
            tally.endings[ended] += 1
    except (TimeoutError, aiohttp.ClientError) as exc:
        tally.endings[f"lost_{type(exc).__name__}"] += 1


async def client_loop(gw: str, model: str, tally: Tally, until: float, seed: int, max_tokens: int) -> None:
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < until:
            await one_request(session, gw, model, tally, rng, max_tokens)
            await asyncio.sleep(rng.uniform(0, 0.2))


async def post_json(url: str, payload: dict) -> None:
    async with aiohttp.ClientSession() as session, session.post(url, json=payload) as response:
        text = await response.text()
        if response.status != 200:
            raise BenchError(f"POST {url} answered {response.status}: {text[:500]}")


async def get_json(url: str) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        return await _get_json(session, url, headers=admin_headers())  # type: ignore[no-any-return]


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sim_port = free_port()
        self.sim: RunningProcess | None = None
        self.gateway: RunningProcess | None = None
        self.tally = Tally()
        self.samples: list[tuple[float, float, int]] = []  # (seconds since start, RSS MB, open fds)
        self.faults: list[tuple[float, str]] = []

    def start_sim(self) -> RunningProcess:
        self.sim = start_process(
            sweetspot("sim", "--port", str(self.sim_port), "--admin", "--time-scale", str(self.args.time_scale)),
            ready_pattern=LISTENING,
            ready_url="{url}/health",
            timeout=60,
        )
        return self.sim

    async def fault(self, name: str, gw: str, model: str, until: float) -> None:
        sim = f"http://127.0.0.1:{self.sim_port}"
        scale = self.args.fault_period_s / 60  # the faults last their share of the period between them
        if name == "restart":
            assert self.sim is not None
            self.sim.stop()
            await asyncio.sleep(5 * scale)
            await asyncio.to_thread(self.start_sim)
        elif name == "slowdown":
            await post_json(f"{sim}/admin/scenario", {"speed_factor": 2.0})
            await asyncio.sleep(30 * scale)
            await post_json(f"{sim}/admin/scenario", {"reset": True})
        elif name == "error_storm":
            await post_json(f"{sim}/admin/scenario", {"error_rate": 0.5})
            await asyncio.sleep(20 * scale)
            await post_json(f"{sim}/admin/scenario", {"reset": True})
        elif name == "hang_ups":
            self.tally.hang_up_share = 0.1
            await asyncio.sleep(30 * scale)
            self.tally.hang_up_share = 0.0
        elif name == "burst":
            await asyncio.gather(
                *(
                    client_loop(gw, model, self.tally, time.monotonic() + 0.1, 10_000 + i, self.args.max_tokens)
                    for i in range(self.args.burst)
                )
            )

    async def run(self) -> dict:
        args = self.args
        self.start_sim()
        env = {"SWEETSPOT_MAX_QUEUE": str(args.max_queue), "SWEETSPOT_QUEUE_TIMEOUT_S": "30"}
        self.gateway = start_process(
            sweetspot(
                "serve", "--upstream", f"http://127.0.0.1:{self.sim_port}", "--port", "0", "--log-level", "warning"
            ),
            ready_pattern=LISTENING,
            ready_url="{url}/readyz",
            env=env,
            timeout=60,
        )
        gw, pid = self.gateway.url, self.gateway.pid
        model = dig(await get_json(f"{gw}/v1/models"), "data", 0, "id", what=f"GET {gw}/v1/models")
        started = time.monotonic()
        until = started + args.minutes * 60
        loops = [client_loop(gw, model, self.tally, until, i, args.max_tokens) for i in range(args.clients)]

        async def sampler() -> None:
            while time.monotonic() < until:
                self.samples.append((time.monotonic() - started, rss_mb(pid), open_fds(pid)))
                await asyncio.sleep(10)

        async def faults() -> None:
            minute = 0  # periods, a minute each by default
            period = args.fault_period_s
            while True:
                await asyncio.sleep(max(0.0, started + period * (minute + 1) - time.monotonic()))
                if time.monotonic() >= until - period / 2:
                    return
                name = FAULTS[minute % len(FAULTS)]
                self.faults.append((time.monotonic() - started, name))
                print(f"[{time.monotonic() - started:6.0f} s] fault: {name}", flush=True)
                await self.fault(name, gw, model, until)
                minute += 1

        await asyncio.gather(*loops, sampler(), faults())
        await asyncio.sleep(2)  # the last releases
        state = await get_json(f"{gw}/state")
        self.samples.append((time.monotonic() - started, rss_mb(pid), open_fds(pid)))
        return self.report(state)

    def report(self, state: dict) -> dict:
        steady = [(t, rss) for t, rss, _ in self.samples if t >= WARMUP_S]
        growth = None
        if len(steady) >= 3:
            times, values = zip(*steady, strict=True)
            growth = statistics.linear_regression(times, values).slope * 600
        lost = sum(n for ending, n in self.tally.endings.items() if ending.startswith("lost"))
        return {
            "command": " ".join(["python -m bench.soak", *sys.argv[1:]]),
            "minutes": self.args.minutes,
            "clients": self.args.clients,
            "max_queue": self.args.max_queue,
            "endings": dict(sorted(self.tally.endings.items())),
            "lost": lost,
            "inflight_at_end": sum(dig(u, "inflight", what="an upstream of /state") for u in dig(state, "upstreams")),
            "queue_depth_at_end": dig(state, "queue", "depth", what="/state"),
            "open_fds": [fds for _, _, fds in self.samples],
            "rss_mb": [[round(t), round(rss, 1)] for t, rss, _ in self.samples],
            "rss_growth_mb_per_10_min": None if growth is None else round(growth, 2),
            "faults": [[round(t), name] for t, name in self.faults],
            "fault_period_s": self.args.fault_period_s,
        }

    def stop(self) -> None:
        for proc in (self.gateway, self.sim):
            if proc is not None:
                proc.stop()


def markdown(result: dict) -> str:
    rss = result["rss_mb"]
    period = result.get("fault_period_s", 60.0)
    pace = "one a minute" if period == 60 else f"one every {period:g} s"
    lines = [
        "<!-- generated by python -m bench.soak; rerun it rather than editing -->",
        f"Command: `{result['command']}` ({result['minutes']} minutes, {result['clients']} closed-loop streaming "
        f"clients, queue {result['max_queue']}; faults, {pace}: {', '.join(n for _, n in result['faults'])}).",
        "",
        "| measure | value | must be |",
        "| --- | --- | --- |",
        f"| requests lost (no answer at all) | {result['lost']} | 0 |",
        f"| permits in flight at the end | {result['inflight_at_end']} | 0 |",
        f"| queue depth at the end | {result['queue_depth_at_end']} | 0 |",
        f"| open file descriptors (first / last / max) | {result['open_fds'][0]} / {result['open_fds'][-1]} / "
        f"{max(result['open_fds'])} | flat |",
        f"| RSS (first / last / max), MB | {rss[0][1]} / {rss[-1][1]} / {max(r for _, r in rss)} | |",
        f"| RSS growth after {WARMUP_S:.0f} s of warm-up, per 10 minutes | "
        f"{result['rss_growth_mb_per_10_min']} MB | < 5 MB |",
        "",
        "Endings: " + ", ".join(f"{name} {count}" for name, count in result["endings"].items()) + ".",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=74, help="twice the default profile's sweet spot (37)")
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("--burst", type=int, default=300, help="extra clients at once in the burst fault")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--fault-period-s", type=float, default=60.0, help="seconds between faults; each lasts its share of them"
    )
    parser.add_argument("--docs", type=Path, help="write the markdown report here")
    add_quick(parser, QUICK)
    args = parse(parser)
    soak = Soak(args)
    try:
        result = asyncio.run(soak.run())
    finally:
        soak.stop()
    text = markdown(result)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, result, indent=2)
    if args.docs is not None:
        args.docs.write_text("# Soak: the gateway under faults, for a long time\n\n" + text)
    failed = (
        result["lost"]
        or result["inflight_at_end"]
        or result["queue_depth_at_end"]
        or (result["rss_growth_mb_per_10_min"] is not None and result["rss_growth_mb_per_10_min"] >= 5)
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
