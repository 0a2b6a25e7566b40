"""Small process utilities shared by the benchmark scripts: start a server, read its CPU and memory."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def start(cmd: list[str], pattern: str, *, timeout_s: float = 60.0, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``cmd`` and wait until a line of its output matches ``pattern`` (group 1: the URL)."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            # Keep draining output so the child never blocks on a full pipe.
            import threading

            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, match.group(1)
    stop(proc)
    raise RuntimeError(f"{cmd[0]} did not start:\n{''.join(seen[-30:])}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def gateway_cmd(upstream: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gateway", "serve", "--upstream", upstream, "--port", "0", *extra]
