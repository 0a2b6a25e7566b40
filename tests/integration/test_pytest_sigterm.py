"""A pytest run ended by SIGTERM (a CI job's timeout, ``kill``) leaves no server behind: tests/conftest.py
turns the signal into an interrupt, and pytest tears down the fixtures that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

INNER = """
import time

def test_holds_a_server(processes, tmp_path_factory):
    proc = processes([{python!r}, "-c", "import time; print('up', flush=True); time.sleep(300)"],
                     ready_pattern="up")
    with open({pid_file!r}, "w") as out:
        out.write(str(proc.popen.pid))
    time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_pytest_stops_the_processes_its_tests_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    inner = tmp_path / "test_inner.py"
    inner.write_text(INNER.format(python=sys.executable, pid_file=str(pid_file)))
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.conftest",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(inner),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert run.poll() is None, f"the inner pytest ended early:\n{run.communicate()[0]}"
            assert time.monotonic() < deadline, "the inner test never started its server"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        assert alive(child)
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=30)[0]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    left = alive(child)
    if left:
        os.killpg(child, signal.SIGKILL)  # its own session: the group is the child's pid
    assert not left, f"pytest ended ({run.returncode}) and left its server {child} running:\n{output}"
