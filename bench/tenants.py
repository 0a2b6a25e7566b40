"""Tenants under the adaptive limit, side by side in one run: fair vs fifo, weights, classes, the scenarios.

Everything runs in the scenario harness (:mod:`tests.support.scenarios.harness`): the simulator's
continuous-batching engine on virtual time, the real controller (:mod:`gateway.control`) setting the limit,
and the gateway's own queue discipline (:mod:`gateway.server.fair_queue`) in front of it. Deterministic,
and minutes of simulated load in seconds of CPU.

    .venv/bin/python -m bench.tenants                         # all four cases, table + docs/tenants.json
    .venv/bin/python -m bench.tenants --cases noisy weights   # some of them

Cases (each a claim of issue #17):

* ``noisy``: a noisy tenant with 200 closed-loop clients and a quiet one with 4, same weight, under the
  controller; ``fair`` and ``fifo`` in the same run. Quiet tenant's p99 queue wait, its client-side TTFT p99
  against the backend's own TTFT p99 (from admission) over all requests of the same run.
* ``weights``: two saturating tenants (100 clients each), weights 3:1: their output tokens.
* ``classes``: 8 interactive clients and 1,000 + limit batch clients (about 1,000 batch requests queued):
  interactive p99 queue wait, and how full the batch class keeps the slots the interactive one leaves.
* ``scenarios``: the controller's scenarios (tests/support/scenarios) without tenants, and with two
  tenants 3:1 and three 3:1:2 (clients round robin): every phase's checks and goodput ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from gateway.control.config import AimdConfig
from gateway.sim.profiles import DEFAULT_PROFILE, get_profile
from tests.support.scenarios.harness import Conditions, Finished, Harness, Tenancy, TenantSpec, Workload

ROOT = Path(__file__).resolve().parent.parent
#: A chat mix: prompts of 256-1024 tokens, answers of 64-384.
CHAT = Workload(prompt=(256, 1024), output=(64, 384))
WARMUP_S = 120.0
MEASURE_S = 900.0


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
    return {"limit_mean": round(sum(t.limit for t in ticks) / len(ticks), 1),
            "slots_busy_min": round(min(t.inflight / t.limit for t in ticks), 3),
            "slots_busy_mean": round(sum(min(t.inflight / t.limit, 1.0) for t in ticks) / len(ticks), 3)}


def noisy() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for discipline in ("fair", "fifo"):
        tenancy = Tenancy((TenantSpec("quiet"), TenantSpec("noisy")), discipline=discipline,  # type: ignore[arg-type]
                          assign=lambda client: 0 if client < 4 else 1)
        harness, start = run(tenancy, 204)
        done = measured(harness, start)
        quiet = [f.sample for f in done if f.tenant == "quiet"]
        noisy_ = [f.sample for f in done if f.tenant == "noisy"]
        backend = [s.upstream_ttft for f in done if (s := f.sample).upstream_ttft is not None]
        quiet_ttft = [s.ttft for s in quiet if s.ttft is not None]
        out[discipline] = {
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
    return {"output_tokens": tokens, "ratio": round(tokens["heavy"] / max(tokens["light"], 1), 3),
            **limits(harness, start)}


def classes() -> dict[str, Any]:
    interactive = 8
    batch_clients = 1000 + 64  # enough that about 1,000 stay queued whatever the limit
    tenancy = Tenancy((TenantSpec("interactive", cls=0), TenantSpec("batch", cls=1)),
                      assign=lambda client: 0 if client < interactive else 1)
    harness, start = run(tenancy, interactive + batch_clients)
    done = measured(harness, start)
    waits = {name: [f.sample.queue_wait for f in done if f.tenant == name] for name in ("interactive", "batch")}
    ticks = [t for t in harness.trace.ticks if t.now >= start]
    return {
        "interactive_requests": len(waits["interactive"]),
        "interactive_queue_p99_s": round(pct(waits["interactive"], 99), 3),
        "batch_requests": len(waits["batch"]),
        "queued_min": min(t.queue for t in ticks),
        "batch_output_tokens_per_s": round(sum(f.sample.output_tokens for f in done if f.tenant == "batch")
                                           / MEASURE_S, 1),
        **limits(harness, start),
    }


def scenarios() -> dict[str, Any]:
    from tests.support.scenarios.catalogue import SCENARIOS
    from tests.support.scenarios.catalogue import run as run_scenario

    runs = (("plain", None),
            ("tenants_3_1", Tenancy((TenantSpec("a", weight=3.0), TenantSpec("b", weight=1.0)))),
            ("tenants_3_1_2", Tenancy((TenantSpec("a", weight=3.0), TenantSpec("b", weight=1.0),
                                       TenantSpec("c", weight=2.0)))))
    out: dict[str, Any] = {}
    for scenario in SCENARIOS:
        row = {}
        for name, given in runs:
            phases = run_scenario(scenario, tenancy=given)
            row[name] = {"ok": all(p.ok for p in phases),
                         "goodput_ratio": [p.goodput_ratio for p in phases],
                         "settled": [p.settled for p in phases],
                         "failures": [f for p in phases for f in p.failures]}
        out[scenario.name] = row
    return out


CASES = {"noisy": noisy, "weights": weights, "classes": classes, "scenarios": scenarios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "tenants.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"profile": DEFAULT_PROFILE, "workload": {"prompt": CHAT.prompt, "output": CHAT.output},
                               "warmup_s": WARMUP_S, "measure_s": MEASURE_S}
    for name in args.cases:
        began = time.perf_counter()
        results[name] = CASES[name]()
        print(f"== {name} ({time.perf_counter() - began:.0f} s)")
        print(json.dumps(results[name], indent=2))
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
