"""Every benchmark the docs cite runs to its end: each bench's ``--quick`` mode (or its cheapest selection) as a
subprocess, exit 0, and its ``--json`` holding every figure the full run reports (not the figures' values: a
run of seconds says nothing about them). Where a bench's full run is recorded in docs/*.json, the figures are
that file's keys; otherwise they are listed here. docs/benchmarks.md lists each bench with its smoke run, or
why it has none (the vLLM benches: vLLM's start alone takes minutes).

One near-free llama-server serves the module (the benches that take ``--upstream``); the others start what
they measure themselves, as a user's run does. Without the binary the module fails with "run `make
llama-server`".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench._json import strict_loads
from bench.overhead import (
    BUDGETS,
    COMPARED,
    GRANIAN_FIGURES,
    GRANIAN_PAIRS,
    PAIRED_BY_ROUND,
    PHASES,
    granian_installed,
)
from bench.profile import LOADS
from bench.soak import FAULTS
from gateway.common.processes import RunningProcess
from testbed.llama import llama_binary, start_llama_server
from testbed.llama_process import NEAR_FREE_ALIAS, NEAR_FREE_MODEL
from testbed.llama_server import LlamaServerConfig
from testbed.tiny_gguf import ensure_model

pytestmark = [pytest.mark.llama, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def upstream(module_processes) -> str:
    """The near-free llama-server of ``bench.overhead`` (32 slots, HTTP threads for several proxies' pools)."""
    llama_binary()  # fails with the command that builds it
    config = LlamaServerConfig(
        model=ensure_model(NEAR_FREE_MODEL),
        port=0,
        parallel=32,
        threads=1,
        alias=NEAR_FREE_ALIAS,
        extra=("--threads-http", "256"),
    )
    proc: RunningProcess = start_llama_server(module_processes, config)
    return proc.url


def run_bench(module: str, *args: str, timeout_s: float = 180.0) -> str:
    """``python -m bench.MODULE ARGS`` from the repository root; its output, or a failure that shows it.

    On a timeout the bench gets SIGINT first, so its ``finally`` blocks stop the servers it started (they run
    in sessions of their own), then SIGKILL."""
    cmd = [sys.executable, "-m", f"bench.{module}", *args]
    began = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd[1:])} ran past {timeout_s:.0f} s:\n{output[-6000:]}", pytrace=False)
    took = time.monotonic() - began
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd[1:])} exited {proc.returncode} after {took:.0f} s:\n{output[-6000:]}",
            pytrace=False,
        )
    print(f"{' '.join(cmd[1:])}: {took:.1f} s")
    return output


def missing(recorded: Any, got: Any, path: str = "$") -> list[str]:
    """The keys of ``recorded`` (a full run's JSON) that ``got`` lacks, as paths: objects key by key, a list of
    objects by its first item. A figure present with no value (null) counts as present."""
    if isinstance(recorded, dict):
        if got is None:
            return []
        if not isinstance(got, dict):
            return [f"{path} (not an object: {got!r:.80})"]
        out = []
        for key, value in recorded.items():
            if key not in got:
                out.append(f"{path}.{key}")
            else:
                out += missing(value, got[key], f"{path}.{key}")
        return out
    if isinstance(recorded, list) and recorded and isinstance(recorded[0], dict):
        if not isinstance(got, list) or not got:
            return [f"{path} (no items)"]
        return [m for item in got for m in missing(recorded[0], item, f"{path}[]")][: len(recorded[0]) + 1]
    return []


def recorded(name: str) -> Any:
    return strict_loads((DOCS / name).read_text())


def test_overhead_quick(upstream, tmp_path):
    """``bench.overhead --quick --peers --compare HEAD``: every phase, every figure of the recorded full run for
    each proxy (the README's peers: ``bench/pump_floor.py``, ``bench/floor_proxy.py``, nginx when installed) and
    both gateways (this tree's, and HEAD's from a temporary worktree that is removed afterwards), their ratios,
    and the memory phase for both; with granian installed (the ``bench`` extra), floor-granian and
    gateway-granian too, and their CPU over uvicorn's."""
    out = tmp_path / "overhead.json"
    worktrees = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    run_bench("overhead", "--quick", "--peers", "--upstream", upstream, "--compare", "HEAD", "--json", str(out))
    got = strict_loads(out.read_text())
    full = recorded("overhead.json")
    other = got["compare"]["name"]
    assert other.startswith("gateway@"), got["compare"]
    granian_peers = [mine for mine, _ in GRANIAN_PAIRS] if granian_installed() else []
    assert [p for p in got["proxies"] if p != "nginx"] == ["pump", "floor", "gateway", other, *granian_peers]
    if granian_peers:
        for mine, theirs in GRANIAN_PAIRS:
            pair = got["granian"][f"{mine}/{theirs}"]
            assert set(pair["ratios"]) == {f"{phase}.{key}" for phase, key in GRANIAN_FIGURES}, pair
            assert isinstance(pair["passes_cpu_rule"], bool), pair
    else:
        assert "granian" not in got
    assert set(got["phases"]) == set(PHASES) >= set(full["phases"])
    problems = [
        m
        for phase, figures in full["phases"].items()
        for name in got["proxies"]
        for m in missing(figures["gateway"], got["phases"][phase][name], f"$.phases.{phase}.{name}")
    ]
    problems += missing({k: v for k, v in full.items() if k != "phases"}, got)
    problems += missing(full["memory"], got["memory_by_gateway"][other], f"$.memory_by_gateway.{other}")
    assert not problems, f"figures of the full run missing from the quick one: {problems}"
    ratios = got["compare"]["ratios"]
    assert set(ratios) == {*PHASES, "memory"}
    by_round = {f"{key}_by_round" for key in PAIRED_BY_ROUND}
    assert all(set(COMPARED) <= set(ratios[phase]) <= set(COMPARED) | by_round for phase in PHASES), ratios
    for phase in PHASES:  # every phase counts requests; the streamed ones chunks too
        assert len(ratios[phase]["cpu_ms_per_request_by_round"]) == got["rounds"], ratios[phase]
        assert ("cpu_us_per_chunk_by_round" in ratios[phase]) == (ratios[phase]["cpu_us_per_chunk"] is not None)
    assert set(ratios["memory"]) == {"rss_mb", "rss_growth_mb"}
    assert got["compare"]["commit"] and got["compare"]["ref"] == "HEAD"
    assert [what["ref"] for what in got["compares"]] == ["HEAD"]
    budgets = {f"{phase}.{key}" for phase, key, _, _ in BUDGETS} | {"memory.rss_mb"}
    assert set(got["budgets"]) == budgets and all(isinstance(b["met"], bool) for b in got["budgets"].values())
    after = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    left = [line for line in after.splitlines() if "/sweetspot-" in line and line not in worktrees.splitlines()]
    assert not left, f"the compared ref's worktree was left behind: {left}"


def test_profile_quick(upstream, tmp_path):
    """``bench.profile --quick``: py-spy attached to the floor and to the gateway, a flame graph of each load
    for each, and every part's CPU per request (and per chunk, streamed) in the JSON."""
    run_bench("profile", "--quick", "--upstream", upstream, "--out", str(tmp_path))
    got = strict_loads((tmp_path / "profile.json").read_text())
    assert set(got["targets"]) == {"floor", "gateway"}
    for target, loads in got["targets"].items():
        assert set(loads) == set(LOADS)
        for name, found in loads.items():
            assert (tmp_path / f"{target}-{name}.svg").read_text().lstrip().startswith("<?xml")
            assert found["samples"] > 0 and found["us_per_request"], found
            assert ("us_per_chunk" in found) == LOADS[name]["stream"], found
    gateway_parts = set(got["targets"]["gateway"]["plain"]["us_per_request"])
    assert {"access log", "routes (forward, errors)", "aiohttp (upstream client)"} <= gateway_parts


def test_workers_quick(upstream, tmp_path):
    out = tmp_path / "workers.json"
    run_bench("workers", "--quick", "--upstream", upstream, "--json", str(out))
    got = strict_loads(out.read_text())
    full = recorded("workers.json")
    problems = missing({k: v for k, v in full.items() if k != "proxies"}, got)
    problems += [
        m for name in ("workers=1", "workers=2") for m in missing(full["proxies"][name], got["proxies"].get(name, {}))
    ]
    assert {"workers=1", "workers=2"} <= set(got["proxies"])
    assert not problems, problems


def test_upstream_client_quick(upstream, tmp_path):
    out = tmp_path / "upstream_client.json"
    run_bench("upstream_client", "--quick", "--upstream", upstream, "--json", str(out))
    got = strict_loads(out.read_text())
    for client in ("aiohttp", "httpx"):
        assert set(got[client]) == {"ms_per_request", "ms_per_streamed_request"}, got


def test_llama_direct_quick(tmp_path):
    out = tmp_path / "llama_direct.json"
    run_bench("llama_direct", "--quick", "--json", str(out))
    got = strict_loads(out.read_text())
    assert [level["concurrency"] for level in got["levels"]] == [1, 2]
    figures = {"tokens_per_s", "requests", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "load_before", "load_after"}
    assert all(figures <= set(level) for level in got["levels"]), got["levels"]


def test_llama_curve_quick(tmp_path):
    out = tmp_path / "llama_curve.json"
    docs = tmp_path / "llama_curve.md"
    run_bench("llama_curve", "--quick", "--json", str(out), "--docs", str(docs))
    got = strict_loads(out.read_text())
    full = recorded("llama-curve.json")
    problems = missing({"meta": full["meta"], "rows": full["rows"]}, got)
    problems += missing(full["levels"]["2"], got["levels"]["2"], "$.levels.2")
    assert not problems, problems
    assert "| " in docs.read_text()


def test_baselines_real_quick(tmp_path):
    """The llama-server half (the vLLM half needs minutes of vLLM's start-up: docs/benchmarks.md)."""
    out = tmp_path / "baselines_real.json"
    run_bench("baselines_real", "--quick", "--json", str(out))
    got = strict_loads(out.read_text())
    problems = missing(recorded("baselines-real.json")["llama-server"], got["llama-server"], "$.llama-server")
    assert not problems, problems


def test_baselines_real_range_quick(tmp_path):
    """``--range --quick``: llama-server with 1 and 4 slots (the vLLM cases need minutes of vLLM's start-up);
    every figure of the recorded run's same cases, and the table between the markers."""
    out = tmp_path / "range.json"
    docs = tmp_path / "controller.md"
    docs.write_text("before\n<!-- baselines-real-range:begin -->\nSTALE\n<!-- baselines-real-range:end -->\nafter\n")
    run_bench("baselines_real", "--range", "--quick", "--json", str(out), "--docs", str(docs))
    got = strict_loads(out.read_text())
    assert set(got) == {"llama-1", "llama-4"}, got
    full = recorded("baselines-real-range.json")
    problems = [m for key in got for m in missing(full[key], got[key], f"$.{key}")]
    assert not problems, problems
    assert got["llama-4"]["setting"]["statics"] == [1, 2, 4, 8]
    text = docs.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "STALE" not in text
    assert text.count("| llama-server |") == 2, text


def test_controller_scenarios_one(tmp_path):
    out = tmp_path / "scenarios.json"
    run_bench("controller_scenarios", "start_from_sweep", "--json", str(out))
    got = strict_loads(out.read_text())
    figures = {"ok", "sweet_spot", "best_static", "settled", "convergence_s", "goodput", "goodput_ratio", "limits"}
    assert got and all(figures <= set(phase) for phase in got), got


def test_baselines_one(tmp_path):
    out = tmp_path / "baselines.json"
    run_bench("baselines", "start_from_sweep", "--schemes", "controller,threshold", "--json", str(out))
    got = strict_loads(out.read_text())
    assert {row["scheme"] for row in got} == {"controller", "threshold"}
    figures = {"goodput", "goodput_ratio", "ttft_p99_s", "tpot_p99_s", "preemptions", "convergence_s", "settled"}
    assert all(row["phases"] and figures <= set(row["phases"][0]) for row in got), got


def test_baselines_matrix_quick(tmp_path):
    """``--matrix --quick``: the two smallest deployments, phases a quarter as long, two schemes and the
    reference (the best static limit of each phase, switched at its start), which the goals read misses against."""
    out = tmp_path / "matrix.json"
    schemes = "controller,static_switched,static_16"
    output = run_bench("baselines", "--matrix", "--quick", "--schemes", schemes, "--json", str(out))
    got = strict_loads(out.read_text())
    assert {row["scheme"] for row in got["cells"]} == {"controller", "static_switched", "static_16"}
    assert "Read against the reference" in output
    assert len({row["scenario"] for row in got["cells"]}) == 8  # 2 deployments x 4 scenarios
    figures = {"goodput", "goodput_ratio", "best_static", "best_static_goodput", "sweet_spot", "settled"}
    assert all(row["phases"] and figures <= set(row["phases"][0]) for row in got["cells"]), got
    assert {"name", "profile", "overload", "ttft_slo_s"} <= set(got["deployments"][0])


def test_routing_quick(tmp_path):
    out = tmp_path / "routing.json"
    run_bench("routing", "--quick", "--json", str(out))
    got = strict_loads(out.read_text())
    full = recorded("routing.json")
    assert {row["policy"] for row in got["summary"]} == {"prefix", "least_loaded"}
    # decisions: counts by the kind of routing decision, which depend on the policy and the run
    runs = [{k: v for k, v in run.items() if k != "decisions"} for run in full["runs"]]
    problems = missing({"summary": full["summary"], "runs": runs}, got)
    assert all("decisions" in run for run in got["runs"])
    assert not problems, problems


def test_lora_quick(tmp_path):
    out = tmp_path / "lora.json"
    run_bench("lora", "--quick", "--json", str(out))
    got = strict_loads(out.read_text())
    full = recorded("lora.json")
    assert {row["policy"] for row in got["summary"]} == {"affinity", "least_loaded"}
    # placements: counts by where the adapter stood, which depend on the policy and the run
    runs = [{k: v for k, v in run.items() if k != "placements"} for run in full["runs"]]
    problems = missing({"summary": full["summary"], "runs": runs}, got)
    assert all("placements" in run for run in got["runs"])
    assert not problems, problems
    affinity = next(run for run in got["runs"] if run["policy"] == "affinity")
    assert sum(affinity["placements"].values()) > 0  # the gateway placed adapters by affinity
    assert all(run["requests"] > 0 and run["errors"] == 0 for run in got["runs"])


def test_sim_throughput_quick(tmp_path):
    out = tmp_path / "sim_throughput.json"
    run_bench("sim_throughput", "--quick", "--json", str(out))
    got = strict_loads(out.read_text())
    figures = {"predicted_tokens_per_s", "chunks_per_s", "ratio", "server_cpu_percent", "client_cpu_percent"}
    assert len(got) == 1 and figures <= set(got[0]), got


def test_soak_quick(tmp_path):
    """Every fault, one every 2 s; the bench itself exits 1 on a lost request or a permit not given back."""
    out = tmp_path / "soak.json"
    run_bench("soak", "--quick", "--json", str(out))
    got = strict_loads(out.read_text())
    full = recorded("soak.json")
    # endings: counts by how requests ended (error_429, hung_up, ...), which depend on the run
    assert not missing({k: v for k, v in full.items() if k != "endings"}, got)
    assert got["endings"].get("completed"), got["endings"]
    assert {name for _, name in got["faults"]} == set(FAULTS), got["faults"]


def test_autoscaling_quick(tmp_path):
    """The three recipes over the ramp at a tenth of its length: every figure of docs/autoscaling.json, and the
    plot written."""
    out, png = tmp_path / "autoscaling.json", tmp_path / "autoscaling.png"
    run_bench("autoscaling", "--quick", "--json", str(out), "--plot", str(png))
    got = strict_loads(out.read_text())
    assert not missing(recorded("autoscaling.json"), got)
    assert [r["recipe"] for r in got["recipes"]] == ["signal", "waiting", "gpu_util"]
    assert png.stat().st_size > 0


def test_tenants_quick(tmp_path):
    out = tmp_path / "tenants.json"
    run_bench("tenants", "--quick", "--json", str(out))
    got = strict_loads(out.read_text())
    full = recorded("tenants.json")
    problems = missing({case: full[case] for case in ("noisy", "weights", "classes")}, got)
    assert not problems, problems


def test_memory_quick(tmp_path):
    """8 queued 1 MiB requests and 2 answers of 8 MB, in both configurations; the bench exits 1 when a peak RSS
    is over its bound or a client's outcome is not the configuration's (no llama-server: a fake upstream)."""
    out = tmp_path / "memory.json"
    run_bench("memory", "--quick", "--json", str(out))
    got = strict_loads(out.read_text())
    full = recorded("memory.json")
    # outcomes and unexpected: counts and bodies by how requests ended, which depend on the configuration
    figures = [{k: v for k, v in c.items() if k not in ("outcomes", "unexpected")} for c in full["configurations"]]
    assert not missing({"configurations": figures}, got)
    assert [c["name"] for c in got["configurations"]] == ["defaults", "raised"]
    assert all(c["passed"] for c in got["configurations"]), got
