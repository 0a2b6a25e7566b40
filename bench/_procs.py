"""Small process utilities shared by the benchmark scripts: start a server, read its CPU and memory.

Starting and stopping is :mod:`gateway.common.processes` (the tests' own process handling): a child in
its own process group, its output drained on a thread, stopped with its whole group.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway.common.processes import RunningProcess, start_process

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(
    cmd: Sequence[str],
    pattern: str,
    *,
    timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> tuple[RunningProcess, str]:
    """Start ``cmd`` and wait until a line of its output matches ``pattern`` (group 1: the URL)."""
    proc = start_process(cmd, ready_pattern=pattern, env=env, cwd=cwd, timeout=timeout_s)
    return proc, proc.url


def gateway_cmd(upstream: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gateway", "serve", "--upstream", upstream, "--port", "0", *extra]
