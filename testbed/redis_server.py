"""Start Debian's ``redis-server`` for the tests of the replicas' shared state.

No persistence, loopback only, on a port picked here (redis-server cannot announce a kernel-picked
one). When the binary is missing the test fails with how to get it: a shared-state test that does not
run is no evidence.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from gateway.common.processes import RunningProcess, free_port

Start = Callable[..., RunningProcess]


def redis_binary() -> str:
    binary = shutil.which("redis-server") or next((p for p in ("/usr/bin/redis-server",) if Path(p).exists()), None)
    if binary is None:
        raise AssertionError("redis-server is not installed: apt-get install redis-server (Debian's package)")
    return binary


def start_redis(start: Start, port: int | None = None) -> tuple[RunningProcess, str]:
    """``(process, redis://127.0.0.1:PORT/0)``, ready to accept connections."""
    port = port or free_port()
    cmd = [
        redis_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
    ]
    proc = start(cmd, ready_pattern=r"Ready to accept connections")
    return proc, f"redis://127.0.0.1:{port}/0"
