"""Tenants under the adaptive limit, side by side in one run: fair vs fifo, weights, classes, the scenarios.

Everything runs in the scenario harness (:mod:`testbed.scenarios.harness`): the simulator's
continuous-batching engine on virtual time, the real controller (:mod:`gateway.control`) setting the limit,
and the gateway's own queue discipline (:mod:`gateway.server.admission.fair_queue`) in front of it. Deterministic,
and minutes of simulated load in seconds of CPU.

    .venv/bin/python -m bench.tenants                         # all four cases, table + docs/tenants.json
    .venv/bin/python -m bench.tenants --cases noisy weights   # some of them
    .venv/bin/python -m bench.tenants --quick --json /tmp/t.json   # a smoke run of the simulated cases

Cases (each a claim of issue #17):

* ``noisy``: a noisy tenant with 200 closed-loop clients and a quiet one with 4, same weight, under the
  controller; ``fair`` (with the default reserve, 0.1), ``fair`` with a reserve of 0.05 and of 0 (the fair
  queue's order alone), and ``fifo``, in the same run. Quiet tenant's p99 queue wait, its client-side TTFT p99
  against the backend's own TTFT p99 (from admission) over all requests of the same run.
* ``weights``: two saturating tenants (100 clients each), weights 3:1: their output tokens.
* ``classes``: 8 interactive clients and 1,000 + limit batch clients (about 1,000 batch requests queued):
  interactive p99 queue wait, and how full the batch class keeps the slots the interactive one leaves;
  with the default reserve and without one.

Every case reports ``admitted_above_limit``: admissions that took in-flight above the limit (none: the
controller's limit holds; in-flight is above it only after the controller lowered it).
* ``live``: the ``noisy`` case over HTTP (``sweetspot sim`` in real time, ``sweetspot serve``, aiohttp
  clients with two keys), 60 s measured after 30 s: slower and noisier, and only on a machine with cores
  to spare for 204 streams.
* ``scenarios``: the controller's scenarios (testbed/scenarios) without tenants, and with two
  tenants 3:1 and three 3:1:2 (clients round robin): every phase's checks and goodput ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from pathlib import Path
from typing import Any

from bench._http import admin_headers, dig, get_json, get_text
from bench._json import dumps, write_json
from bench._quick import add_quick, parse
from gateway.control.config import AimdConfig
from gateway.settings import Settings
from gateway.sim.profiles import DEFAULT_PROFILE, get_profile
from testbed.scenarios.harness import Conditions, Finished, Harness, Tenancy, TenantSpec, Workload

ROOT = Path(__file__).resolve().parent.parent
#: A chat mix: prompts of 256-1024 tokens, answers of 64-384.
CHAT = Workload(prompt=(256, 1024), output=(64, 384))
WARMUP_S = 120.0
MEASURE_S = 900.0
RESERVE = Settings.model_fields["tenant_reserve"].default  # the gateway's default


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def measured(harness: Harness, start: float) -> list[Finished]:
    return [f for f in harness.trace.finished if f.sample.admitted >= start]


def run(tenancy: Tenancy, clients: int, *, workload: Workload = CHAT, seed: int = 1) -> tuple[Harness, float]:
    harness = Harness(get_profile(DEFAULT_PROFILE), AimdConfig(), seed=seed, tenancy=tenancy)
    conditions = Conditions(clients=(clients,), workload=workload)
    harness.run_phase(conditions, WARMUP_S)
    start = harness.now
    harness.run_phase(conditions, MEASURE_S)
    return harness, start


def limits(harness: Harness, start: float) -> dict[str, float]:
    ticks = [t for t in harness.trace.ticks if t.now >= start]
    return {
        "admitted_above_limit": sum(gw.admitted_over for gw in harness.gateways),
        "limit_mean": round(sum(t.limit for t in ticks) / len(ticks), 1),
        "slots_busy_min": round(min(t.inflight / t.limit for t in ticks), 3),
        "slots_busy_mean": round(sum(min(t.inflight / t.limit, 1.0) for t in ticks) / len(ticks), 3),
    }


def noisy() -> dict[str, Any]:
    out: dict[str, Any] = {}
    variants = (
        ("fair", "fair", RESERVE),
        ("fair_reserve_0.05", "fair", 0.05),
        ("fair_no_reserve", "fair", 0.0),
        ("fifo", "fifo", 0.0),
    )
    for name, discipline, reserve in variants:
        tenancy = Tenancy(
            (TenantSpec("quiet"), TenantSpec("noisy")),
            discipline=discipline,  # type: ignore[arg-type]
            assign=lambda client: 0 if client < 4 else 1,
            reserve=reserve,
        )
        harness, start = run(tenancy, 204)
        done = measured(harness, start)
        quiet = [f.sample for f in done if f.tenant == "quiet"]
        noisy_ = [f.sample for f in done if f.tenant == "noisy"]
        backend = [s.upstream_ttft for f in done if (s := f.sample).upstream_ttft is not None]
        quiet_ttft = [s.ttft for s in quiet if s.ttft is not None]
        out[name] = {
            "quiet_requests": len(quiet),
            "quiet_queue_p99_s": round(pct([s.queue_wait for s in quiet], 99), 3),
            "quiet_ttft_p99_s": round(pct(quiet_ttft, 99), 3),
            "backend_ttft_p99_s": round(pct(backend, 99), 3),
            "quiet_ttft_over_backend_s": round(pct(quiet_ttft, 99) - pct(backend, 99), 3),
            "noisy_queue_p99_s": round(pct([s.queue_wait for s in noisy_], 99), 3),
            "tokens_per_s": round(sum(s.output_tokens for s in quiet + noisy_) / MEASURE_S, 1),
            **limits(harness, start),
        }
    return out


def weights() -> dict[str, Any]:
    tenancy = Tenancy((TenantSpec("heavy", weight=3.0), TenantSpec("light", weight=1.0)))
    harness, start = run(tenancy, 200)
    done = measured(harness, start)
    tokens = {name: sum(f.sample.output_tokens for f in done if f.tenant == name) for name in ("heavy", "light")}
    return {
        "output_tokens": tokens,
        "ratio": round(tokens["heavy"] / max(tokens["light"], 1), 3),
        **limits(harness, start),
    }


def classes() -> dict[str, Any]:
    return {"fair": _classes(RESERVE), "fair_no_reserve": _classes(0.0)}


def _classes(reserve: float) -> dict[str, Any]:
    interactive = 8
    batch_clients = 1000 + 64  # enough that about 1,000 stay queued whatever the limit
    tenancy = Tenancy(
        (TenantSpec("interactive", cls=0), TenantSpec("batch", cls=1)),
        assign=lambda client: 0 if client < interactive else 1,
        reserve=reserve,
    )
    harness, start = run(tenancy, interactive + batch_clients)
    done = measured(harness, start)
    waits = {name: [f.sample.queue_wait for f in done if f.tenant == name] for name in ("interactive", "batch")}
    ticks = [t for t in harness.trace.ticks if t.now >= start]
    return {
        "interactive_requests": len(waits["interactive"]),
        "interactive_queue_p99_s": round(pct(waits["interactive"], 99), 3),
        "batch_requests": len(waits["batch"]),
        "queued_min": min(t.queue for t in ticks),
        "batch_output_tokens_per_s": round(
            sum(f.sample.output_tokens for f in done if f.tenant == "batch") / MEASURE_S, 1
        ),
        **limits(harness, start),
    }


def scenarios() -> dict[str, Any]:
    from testbed.scenarios.catalogue import SCENARIOS
    from testbed.scenarios.catalogue import run as run_scenario

    runs = (
        ("plain", None),
        ("tenants_3_1", Tenancy((TenantSpec("a", weight=3.0), TenantSpec("b", weight=1.0)))),
        (
            "tenants_3_1_2",
            Tenancy((TenantSpec("a", weight=3.0), TenantSpec("b", weight=1.0), TenantSpec("c", weight=2.0))),
        ),
    )
    out: dict[str, Any] = {}
    for scenario in SCENARIOS:
        row = {}
        for name, given in runs:
            phases = run_scenario(scenario, tenancy=given)
            row[name] = {
                "ok": all(p.ok for p in phases),
                "goodput_ratio": [p.goodput_ratio for p in phases],
                "settled": [p.settled for p in phases],
                "failures": [f for p in phases for f in p.failures],
            }
        out[scenario.name] = row
    return out


LIVE_S = 60.0  # measured, after LIVE_WARMUP_S
LIVE_WARMUP_S = 30.0
LIVE_CONFIG = """upstreams = ["{sim}"]
queue_discipline = "{discipline}"
[[tenants]]
name = "quiet"
api_keys = ["key-quiet"]
[[tenants]]
name = "noisy"
api_keys = ["key-noisy"]
"""


def live() -> dict[str, Any]:
    """The noisy/quiet case over HTTP: ``sweetspot sim`` (real time), ``sweetspot serve`` with two keyed
    tenants and the controller on, 200 + 4 streaming closed-loop clients (aiohttp); ``fair`` then ``fifo``.
    Queue waits and the backend's TTFT are read from the gateway's histograms (so they are bucket bounds:
    0.25, 0.5, 0.75, 1 s ...); the clients' TTFT is measured exactly."""
    import tempfile

    from gateway.common.processes import LISTENING, start_process, sweetspot

    out: dict[str, Any] = {}
    with start_process(
        sweetspot("sim", "--port", "0", "--seed", "1"), ready_pattern=LISTENING, ready_url="{url}/health"
    ) as sim:
        for discipline in ("fair", "fifo"):
            with tempfile.TemporaryDirectory() as folder:
                config = Path(folder) / "sweetspot.toml"
                config.write_text(LIVE_CONFIG.format(sim=sim.url, discipline=discipline))
                with start_process(
                    sweetspot("serve", "--port", "0", "--config", str(config), "--log-level", "warning"),
                    ready_pattern=LISTENING,
                    ready_url="{url}/readyz",
                ) as gw:
                    out[discipline] = asyncio.run(_drive(gw.url))
    return out


async def _drive(url: str) -> dict[str, Any]:
    import aiohttp

    model = "default"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        models = await get_json(session, f"{url}/v1/models", headers={"authorization": "Bearer key-quiet"})
        model = dig(models, "data", 0, "id", what=f"GET {url}/v1/models")
        ttfts: dict[str, list[float]] = {"quiet": [], "noisy": []}
        loop_time = asyncio.get_running_loop().time
        began = loop_time()
        stop = began + LIVE_WARMUP_S + LIVE_S
        rng = __import__("random").Random(7)

        async def client(tenant: str) -> None:
            headers = {"authorization": f"Bearer key-{tenant}", "content-type": "application/json"}
            while loop_time() < stop:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": "x " * rng.randint(256, 1024)}],
                    "max_tokens": rng.randint(64, 384),
                    "stream": True,
                    "ignore_eos": True,
                }
                sent = loop_time()
                first = None
                async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
                    async for line in resp.content:  # the first token: a delta with content (not the role's)
                        if first is None and b'"content":"' in line and b'"content":""' not in line:
                            first = loop_time()
                if first is not None and sent >= began + LIVE_WARMUP_S and resp.status == 200:
                    ttfts[tenant].append(first - sent)

        tasks = [asyncio.create_task(client("quiet")) for _ in range(4)]
        tasks += [asyncio.create_task(client("noisy")) for _ in range(200)]
        await asyncio.sleep(LIVE_WARMUP_S)
        metrics_before = await _scrape(session, url)
        await asyncio.gather(*tasks)
        metrics_after = await _scrape(session, url)
    delta = _delta(metrics_before, metrics_after)
    return {
        "quiet_requests": len(ttfts["quiet"]),
        "quiet_queue_p99_s_bucket": _bucket_p99(delta, "sweetspot_tenant_queue_wait_seconds", "quiet"),
        "noisy_queue_p99_s_bucket": _bucket_p99(delta, "sweetspot_tenant_queue_wait_seconds", "noisy"),
        "quiet_client_ttft_p99_s": round(pct(ttfts["quiet"], 99), 3),
        "noisy_client_ttft_p99_s": round(pct(ttfts["noisy"], 99), 3),
        "backend_ttft_p99_s_bucket": _bucket_p99(delta, "sweetspot_upstream_ttft_seconds", None),
        "output_tokens_per_s": round(
            sum(v for (name, _), v in delta.items() if name == "sweetspot_tenant_output_tokens_total") / LIVE_S, 1
        ),
    }


async def _scrape(session: Any, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = await get_text(session, f"{url}/metrics", headers=admin_headers())
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _delta(before: dict, after: dict) -> dict:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def _bucket_p99(delta: dict, metric: str, tenant: str | None) -> float | None:
    """The upper bound of the bucket holding the 99th percentile, over the measured interval."""
    buckets = []
    for (name, labels), value in delta.items():
        found = dict(labels)
        if name == f"{metric}_bucket" and (tenant is None or found.get("tenant") == tenant):
            buckets.append((float(found["le"]), value))
    totals: dict[float, float] = {}
    for bound, value in buckets:
        totals[bound] = totals.get(bound, 0.0) + value
    if not totals or not totals.get(math.inf):
        return None
    target = 0.99 * totals[math.inf]
    return next(bound for bound in sorted(totals) if totals[bound] >= target)


CASES = {"noisy": noisy, "weights": weights, "classes": classes, "scenarios": scenarios, "live": live}


#: ``--quick``: the smoke test's run (tests/integration/test_bench_smoke.py): the simulated cases, each over a
#: short simulated interval, and no JSON unless ``--json`` is given (never over docs/tenants.json). Not
#: ``scenarios`` (every scenario three times, minutes of CPU) nor ``live`` (204 streams for 90 s).
QUICK = {"cases": ["noisy", "weights", "classes"], "warmup_s": 20.0, "measure_s": 60.0, "json": None}


def main() -> None:
    global WARMUP_S, MEASURE_S  # the cases read them; the options set them for this run
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "tenants.json")
    parser.add_argument("--warmup-s", type=float, default=WARMUP_S, help="simulated warm-up of each harness run")
    parser.add_argument("--measure-s", type=float, default=MEASURE_S, help="simulated measured interval of each")
    add_quick(parser, QUICK)
    args = parse(parser)
    WARMUP_S, MEASURE_S = args.warmup_s, args.measure_s
    results: dict[str, Any] = {
        "profile": DEFAULT_PROFILE,
        "workload": {"prompt": CHAT.prompt, "output": CHAT.output},
        "warmup_s": WARMUP_S,
        "measure_s": MEASURE_S,
    }
    for name in args.cases:
        began = time.perf_counter()
        results[name] = CASES[name]()
        print(f"== {name} ({time.perf_counter() - began:.0f} s)")
        print(dumps(results[name], indent=2))
    if args.json is not None:
        write_json(args.json, results, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
