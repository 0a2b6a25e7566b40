"""``sweetspot serve --workers N``: N worker processes on one port, each a replica, draining together."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx

from testbed.fault_upstream import wait_for
from testbed.gateway import start_gateway, start_sim

CHAT = [{"role": "user", "content": "hello"}]


def children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def answering_processes(url: str, tries: int) -> set[int]:
    """Which processes answer ``/state`` over fresh connections (the kernel spreads them over workers)."""
    seen = set()
    for _ in range(tries):
        with httpx.Client(timeout=10) as client:
            seen.add(int(client.get(f"{url}/state").json()["process"]))
    return seen


def test_workers_share_one_port_and_each_answers(processes) -> None:
    sim = start_sim(processes)
    proc = start_gateway(processes, [sim.url], "--workers", "3")
    workers = children(proc.popen.pid)
    assert len(workers) == 3
    assert answering_processes(proc.url, 60) == workers
    model = httpx.get(f"{sim.url}/v1/models", timeout=10).json()["data"][0]["id"]
    statuses = []
    for _ in range(12):
        with httpx.Client(timeout=60) as client:
            reply = client.post(
                f"{proc.url}/v1/chat/completions", json={"model": model, "messages": CHAT, "max_tokens": 8}
            )
            statuses.append(reply.status_code)
    assert statuses == [200] * 12


def test_sigterm_drains_every_worker_and_the_parent_exits_0(processes) -> None:
    sim = start_sim(processes, time_scale=1.0)
    proc = start_gateway(
        processes,
        [sim.url],
        "--workers",
        "2",
        "--no-control",
        "--initial-limit",
        "8",
        env={"SWEETSPOT_DRAIN_TIMEOUT_S": "60"},
    )
    model = httpx.get(f"{sim.url}/v1/models", timeout=10).json()["data"][0]["id"]
    workers = children(proc.popen.pid)
    finished: list[int] = []

    def stream() -> None:
        body = {"model": model, "messages": CHAT, "stream": True, "max_tokens": 120, "ignore_eos": True}
        with (
            httpx.Client(timeout=120) as client,
            client.stream("POST", f"{proc.url}/v1/chat/completions", json=body) as reply,
        ):
            done = any(line.strip() == "data: [DONE]" for line in reply.iter_lines())
            finished.append(reply.status_code if done else -1)

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    # streams running on both workers: each one's /state shows some in flight
    assert wait_for(lambda: _inflight_by_process(proc.url) >= workers, 30)
    proc.popen.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(90)
    assert proc.popen.wait(90) == 0
    assert finished == [200] * 8
    assert not any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in workers)


def _inflight_by_process(url: str) -> set[int]:
    seen = set()
    for _ in range(20):
        with httpx.Client(timeout=10) as client:
            state = client.get(f"{url}/state").json()
        if state["upstreams"][0]["inflight"] > 0:
            seen.add(int(state["process"]))
    return seen


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_worker_that_dies_takes_the_others_down_and_the_parent_fails(processes) -> None:
    """A host running on fewer workers than it was given, unnoticed, is worse than a restart."""
    sim = start_sim(processes)
    proc = start_gateway(processes, [sim.url], "--workers", "2", env={"SWEETSPOT_DRAIN_TIMEOUT_S": "5"})
    first, second = sorted(children(proc.popen.pid))
    os.kill(first, signal.SIGKILL)
    assert proc.popen.wait(30) == 1
    assert wait_for(lambda: not _alive(second), 10)
