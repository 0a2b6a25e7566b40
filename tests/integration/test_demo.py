"""``sweetspot demo --quick`` as CI runs it: no terminal, real child processes, files at the end.

The quick variant drives the same code path as ``make demo`` (simulator, sweep, gateway started from
the sweep's result, the five load phases, summary, plot, JSON), only shorter. These tests check that it
runs to the end with plain output, that its summary and JSON say what the demo is for, and that no
child process outlives it, whether it ends normally or by Ctrl-C; and that ``--quick --elastic`` shows a second
simulator joining the running gateway.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gateway.settings import Settings
from gateway.sweep.result import load_sweep_result

ANSI = re.compile(r"\x1b\[")
DEMO = [sys.executable, "-m", "gateway", "demo", "--quick"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie not yet reaped by its (gone) parent counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the thread has exited
            found |= {int(p) for p in (task / "children").read_text().split()}
    return found


def _run_demo(out: Path, options: list[str], expected: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """Run the quick demo into ``out`` without a terminal; check that it ends well, in plain text, saying each of
    ``expected``; return its output and its demo.json."""
    proc = subprocess.run(
        [*DEMO, *options, "--out", str(out)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
        text=True,
    )
    text = proc.stdout
    assert proc.returncode == 0, text[-4000:]
    assert not ANSI.search(text), "plain output expected without a terminal (no colours, no cursor moves)"
    for phrase in expected:
        assert phrase in text, f"{phrase!r} missing from the demo's output:\n{text[-4000:]}"
    return text, json.loads((out / "demo.json").read_text())


def test_quick_demo_runs_to_the_end_without_a_terminal(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    _, doc = _run_demo(
        out,
        ["--print-every", "2"],
        (
            "simulator listening on",
            "sweet spot:",
            "gateway listening on",
            "phase 1/5: light",
            "phase 3/5: slow backend",
            "where the controller held",
            "result:",
            "files:",
        ),
    )
    assert doc["kind"] == "sweetspot.demo" and doc["interrupted"] is False
    sweep = load_sweep_result(out / "sweep" / "sweep.json")
    assert sweep.sweet_spot is not None and doc["sweep"]["sweet_spot"] == sweep.sweet_spot.concurrency
    phases = {p["name"]: p for p in doc["phases"]}
    assert list(phases) == ["light", "surge", "slow backend", "recovered", "calm"]
    assert all(p["samples"] > 0 and p["limit_median"] is not None for p in phases.values()), doc["phases"]
    # 4 clients never make the limit the bottleneck; 64 always exceed the sweet spot of the default profile
    assert not phases["light"]["judged"] and phases["light"]["verdict"] == "not judged"
    for name in ("surge", "slow backend", "recovered"):
        assert phases[name]["judged"] and phases[name]["verdict"] in ("within", "outside"), phases[name]
        assert phases[name]["reference"] is not None and phases[name]["ratio"] is not None
    assert doc["passed"] == all(phases[n]["verdict"] == "within" for n in ("surge", "slow backend", "recovered"))
    # the controller ran, started at the sweep's sweet spot (--sweep-result), and did not drift up
    # while 4 clients left the limit unused
    timeline = doc["timeline"]
    assert doc["controller_seen"], "the gateway's /state showed no controller"
    assert timeline[0]["limit"] == sweep.sweet_spot.concurrency, (timeline[0], sweep.sweet_spot)
    light = [s for s in timeline if s["phase"] == 0]
    assert {s["limit"] for s in light} == {sweep.sweet_spot.concurrency}, light
    assert isinstance(doc["controller_decisions"], list) and doc["controller_decisions"]
    # the load really went through the gateway and reached the backend
    assert max(s["queued"] or 0 for s in timeline) > 0, "64 clients over the limit must queue in the gateway"
    assert max(s["backend_running"] or 0 for s in timeline) > 0
    assert sum(1 for s in timeline if s["tokens_per_s"]) > len(timeline) / 2
    assert timeline[-1]["failed"] == 0, "no client request may fail in the demo"
    # the slow phase is visible in what the clients get
    slow, surge = phases["slow backend"]["tokens_per_s_median"], phases["surge"]["tokens_per_s_median"]
    assert slow < surge, (slow, surge)

    assert (out / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "sweep" / "sweep.png").exists() and (out / "sweep" / "sweep.md").exists()
    assert "listening on" in (out / "gateway.log").read_text()
    assert set(doc["pids"]) == {"sim", "gateway"}
    assert not any(_alive(pid) for pid in doc["pids"].values()), f"child processes left running: {doc['pids']}"


def test_quick_elastic_demo_shows_a_backend_joining(tmp_path: Path) -> None:
    """``--quick --elastic``: open-loop arrivals over one simulator's capacity, then a second simulator listed in the
    gateway's upstreams file joins the running gateway (the same discovery path as production), at its sibling's
    limit; the capacity signal is read from /metrics; the final tables and demo.json report the join."""
    out = tmp_path / "demo"
    text, doc = _run_demo(
        out,
        ["--elastic", "--print-every", "3"],
        (
            "second simulator listening on",
            "phase 1/2: one backend",
            "listed backend-2",
            "phase 2/2: second joins",
            "capacity signal: desired",
            "the pool (steady part of each phase)",
            "each upstream (steady part of each phase)",
            "backend-2 joined at",
            "result: backend-2 joined the running gateway; no client request failed",
        ),
    )
    elastic = doc["elastic"]
    sim2 = next(url for url, label in elastic["labels"].items() if label == "backend-2")
    assert (out / "upstreams.txt").read_text().split("\n")[1:3] == list(elastic["labels"]), "both listed at the end"
    (join,) = elastic["joins"]
    assert join["label"] == "backend-2" and join["joined_at_s"] is not None, join
    # the gateway checks the file every discovery_interval_s (2.5 s at 2x): the join follows the write within a
    # few checks even on a loaded machine, and not before it
    assert 0 <= join["delay_s"] < 15, join
    # its controller started at its sibling's limit (the gateway logs the limit it gave it), not in slow start
    logged = re.search(r"joined \(healthy\) at limit (\d+) \(its siblings' median\)", (out / "gateway.log").read_text())
    assert logged, "the gateway did not log the join at its siblings' median"
    assert join["start_limit"] == int(logged.group(1)) > Settings().initial_limit, (join, logged.group(0))
    # the pool before and after, per phase and per upstream
    assert [p["name"] for p in elastic["pool"]] == ["one backend", "second joins"]
    assert join["before"]["serving"] == 1 and join["after"]["serving"] == 2, join
    rows = {(u["phase"], u["label"]) for u in elastic["upstreams"]}
    assert rows == {("one backend", "backend-1"), ("second joins", "backend-1"), ("second joins", "backend-2")}
    joined = [u for s in doc["timeline"] for u in s["upstreams"] if u["url"] == sim2]
    assert max(u["inflight"] or 0 for u in joined) > 0, "the joined simulator never ran a request"
    # arrivals over one backend's capacity: the queue built up before the join, and the capacity signal asked
    # for more backends than served at some point (its desired figure is absent until a backend was measured)
    before = [s for s in doc["timeline"] if s["phase"] == 0]
    assert max(s["queued"] or 0 for s in before) > 0, f"the arrivals before the join never queued:\n{text[-3000:]}"
    assert all(s["arrivals_per_s"] and s["signal"] for s in doc["timeline"])
    desired = [s["signal"]["desired"] for s in doc["timeline"] if s["signal"]["desired"] is not None]
    assert desired and max(desired) >= 2, f"the capacity signal never asked for a second backend:\n{text[-3000:]}"
    assert doc["timeline"][-1]["failed"] == 0, "no client request may fail while a backend joins"
    assert (out / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(doc["pids"]) == {"sim", "sim-2", "gateway"}
    assert not any(_alive(pid) for pid in doc["pids"].values()), f"child processes left running: {doc['pids']}"


def test_ctrl_c_stops_every_child_process(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    # one sweep level: the sweep's answer does not matter here, only that both children are running
    # Ctrl-C as at a terminal: a suite started in the background by a non-interactive shell inherits SIGINT
    # ignored, and a Python started with it ignored never turns it into KeyboardInterrupt.
    proc = subprocess.Popen(
        [*DEMO, "--levels", "8", "--out", str(out)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 180
        log = out / "gateway.log"
        while not (log.exists() and "listening on" in log.read_text()):
            if proc.poll() is not None:
                raise AssertionError(f"the demo ended before the gateway started:\n{proc.communicate()[0]}")
            assert time.monotonic() < deadline, "the gateway did not start within 180 s"
            time.sleep(0.2)
        children = _children(proc.pid)
        assert len(children) == 2, f"expected the simulator and the gateway as children, found {children}"
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, text[-3000:]
    assert "interrupted" in text
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in children), f"left running after Ctrl-C: {children}"
