"""``--workers N``: the parent forwards SIGHUP (re-read the upstreams) to every worker, and a worker that has not
installed its own handler yet ignores it rather than dying (gateway/server/process/workers.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from gateway.server.process.workers import READY, run_workers


def test_the_parent_forwards_sighup_to_every_worker(tmp_path: Path) -> None:
    def worker(index: int, ready_fd: int) -> None:
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN  # until the app installs its handler
        signal.signal(signal.SIGHUP, lambda sig, frame: (tmp_path / f"worker-{index}").write_text("hup"))
        os.write(ready_fd, READY)
        deadline = time.monotonic() + 10  # until both heard it (the first to exit stops the other)
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)

    def announce() -> None:  # every worker listens: the operator sends SIGHUP to the parent
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGHUP)).start()

    before = signal.getsignal(signal.SIGHUP)
    run_workers(2, worker, announce=announce)  # the workers exit on their own: the parent reports that as 1
    assert signal.getsignal(signal.SIGHUP) == before  # the parent's handler is gone again
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["hup", "hup"]
