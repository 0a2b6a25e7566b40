"""The demo's child processes (the simulator, the gateway): start them, wait for them, always stop them.

Each child runs ``python -m gateway ...`` with this interpreter, in its own session (so a Ctrl-C on the
terminal reaches only the demo, which then stops its children in order), with stdout and stderr going
to a log file in the demo's output directory: the log is both how we learn the child's URL (the
``... listening on http://HOST:PORT`` line) and what a user reads when something went wrong. On Linux a
child also asks the kernel to kill it should the demo itself die without cleaning up (``SIGKILL``),
so no simulator is ever left running behind a killed demo.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

LISTENING = re.compile(r"listening on (http://\S+)")
_PR_SET_PDEATHSIG = 1


class ChildError(RuntimeError):
    """A child exited or did not become ready; the message carries the tail of its log."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: cleanup relies on the demo's own shutdown path


def sweetspot_command(*args: str) -> list[str]:
    """``sweetspot ARGS`` run by this interpreter (works from a checkout as well as an install)."""
    return [sys.executable, "-m", "gateway", *args]


class Child:
    """One started process: its ``name``, ``url`` (once ready), ``log_path`` and ``pid``."""

    def __init__(self, name: str, cmd: Sequence[str], log_path: Path, popen: subprocess.Popen[bytes]) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = log_path
        self.popen = popen
        self.url: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def _fail(self, what: str) -> ChildError:
        return ChildError(f"{self.name} ({' '.join(self.cmd)}) {what}; its log ({self.log_path}) ends with:\n"
                          f"{self.log_tail()}")

    def wait_listening(self, timeout: float) -> str:
        """Block until the log shows the ``listening on URL`` line; returns (and keeps) the URL."""
        deadline = time.monotonic() + timeout
        while True:
            match = LISTENING.search(self.log_tail(200_000))
            if match:
                self.url = match.group(1)
                return self.url
            if not self.alive():
                raise self._fail(f"exited with code {self.popen.returncode} before listening")
            if time.monotonic() >= deadline:
                raise self._fail(f"printed no 'listening on' line within {timeout:.0f} s")
            time.sleep(0.05)

    def wait_http_ok(self, path: str, timeout: float) -> None:
        """Block until ``GET {url}{path}`` answers 200 (e.g. the gateway's ``/readyz``)."""
        if self.url is None:
            raise RuntimeError("wait_listening first")
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.alive():
                raise self._fail(f"exited with code {self.popen.returncode}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.1)
        raise self._fail(f"did not answer 200 on {path} within {timeout:.0f} s (last: {last})")

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the child's process group, wait, then SIGKILL it. Returns the exit code."""
        if self.alive():
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.pid, signal.SIGKILL)
                self.popen.wait(timeout)
        else:
            _signal_group(self.pid, signal.SIGKILL)  # anything the child left in its group
        return self.popen.returncode


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the child leads its own session, so its group id is its pid
    except (ProcessLookupError, PermissionError):
        pass


class Children:
    """Every process the demo started; leaving the ``with`` block stops them all, newest first."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Child] = []

    def start(self, name: str, cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
              ready_timeout: float = 60.0) -> Child:
        """Start ``cmd`` (logging to ``<log_dir>/<name>.log``) and return once it listens."""
        full_env = dict(os.environ)
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env.update(env or {})
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                start_new_session=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        child = Child(name, cmd, log_path, popen)
        self.started.append(child)
        child.wait_listening(ready_timeout)
        return child

    def stop_all(self) -> None:
        for child in reversed(self.started):
            child.stop()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
