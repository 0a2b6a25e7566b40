"""Start real processes (the demo's children, tests, benchmarks, scripts), wait until they are ready, always
clean them up.

``start_process`` runs a command in its own process group, collects its output (stdout and
stderr together) on a thread, and returns once the process is ready: a line of its output
matched ``ready_pattern`` and/or ``ready_url`` answered 200. If the process dies or is not ready
within ``timeout``, it is killed and the error carries its output, so a failing test says why.
``stop()`` sends SIGTERM to the whole group (children included), then SIGKILL. The output kept is
the last :data:`KEPT_LINES` lines: a server that logs every request for a long benchmark must not grow
without bound in the process that watches it. With ``log_path`` every line is also written to that file
(what a user reads when a demo child failed), and with ``die_with_parent`` the child asks the kernel to
kill it should its parent die without cleaning up (Linux), so no server outlives a killed demo.

Typical use, as a fixture::

    @pytest.fixture
    def sim():
        with start_process(sweetspot("sim", "--port", "0"), ready_pattern=LISTENING) as proc:
            yield proc.url            # the URL captured by the pattern's first group

or with the ``processes`` factory fixture from :func:`process_factory`.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

#: The line ``sweetspot sim`` (and other servers of ours) print once they accept connections.
LISTENING = r"listening on (http://\S+)"
#: Lines of output a :class:`RunningProcess` keeps (older ones are dropped).
KEPT_LINES = 5000
_PR_SET_PDEATHSIG = 1


class ProcessError(RuntimeError):
    """The process exited or did not become ready; the message includes its output."""


class RunningProcess:
    """A started process: its ``url`` (from the ready pattern), its ``output()``, and ``stop()``."""

    def __init__(self, cmd: Sequence[str], popen: subprocess.Popen[bytes], log_path: Path | None = None) -> None:
        self.cmd = list(cmd)
        self.popen = popen
        self.log_path = log_path
        self.match: re.Match[str] | None = None
        self._lines: deque[str] = deque(maxlen=KEPT_LINES)
        self._read_count = 0  # lines read in all, dropped ones included
        self._lock = threading.RLock()  # re-entered: wait_for_line, holding it, reads output() for its error
        self._new_line = threading.Condition(self._lock)
        self._reader = threading.Thread(target=self._read, name=f"output of {Path(cmd[0]).name}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        """The first group of the ready pattern's match (e.g. the URL of ``LISTENING``)."""
        if self.match is None or not self.match.groups():
            raise AttributeError("no ready_pattern with a group matched for this process")
        return self.match.group(1)

    def output(self) -> str:
        with self._lock:
            return "".join(self._lines)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _read(self) -> None:
        assert self.popen.stdout is not None
        try:
            with ExitStack() as files:
                log = files.enter_context(open(self.log_path, "ab", buffering=0)) if self.log_path is not None else None
                for raw in iter(self.popen.stdout.readline, b""):
                    if log is not None:
                        log.write(raw)
                    with self._lock:
                        self._lines.append(raw.decode("utf-8", "replace"))
                        self._read_count += 1
                        self._new_line.notify_all()
        finally:
            with self._lock:
                self._new_line.notify_all()

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match[str]:
        """Block until a line of output matches ``pattern`` (searched, not anchored)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0  # lines already searched, counted from the first line ever read
        with self._lock:
            while True:
                first_kept = self._read_count - len(self._lines)
                for line in list(self._lines)[max(seen - first_kept, 0) :]:
                    m = regex.search(line)
                    if m:
                        return m
                seen = self._read_count
                if self.popen.poll() is not None and not self._reader.is_alive():
                    raise ProcessError(
                        self._why(
                            f"exited with code {self.popen.returncode} before printing a line matching {pattern!r}"
                        )
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProcessError(self._why(f"printed no line matching {pattern!r} within {timeout:.0f}s"))
                self._new_line.wait(min(left, 0.2))

    def wait_for_url(self, url: str, timeout: float) -> None:
        """Block until ``url`` answers HTTP 200 (``url`` may be a path, taken relative to :attr:`url`)."""
        if url.startswith("/"):
            url = self.url + url
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise ProcessError(self._why(f"exited with code {self.popen.returncode} before {url} answered"))
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.1)
        raise ProcessError(self._why(f"{url} did not answer 200 within {timeout:.0f}s (last: {last})"))

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, wait, then SIGKILL it. Returns the exit code."""
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout)
        else:
            _signal_group(self.popen.pid, signal.SIGKILL)  # children may outlive their parent
        self._reader.join(timeout)
        return self.popen.returncode

    def _why(self, what: str) -> str:
        tail = self.output()[-4000:]
        where = f" (log: {self.log_path})" if self.log_path is not None else ""
        return f"{' '.join(self.cmd)}: {what}{where}\n--- output ---\n{tail}"

    def __enter__(self) -> RunningProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):  # the group has gone
        os.killpg(pid, sig)  # the child leads its own session, so its group id is its pid


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with suppress(OSError, AttributeError):  # not Linux: cleanup relies on the parent's own shutdown path
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start_process(
    cmd: Sequence[str],
    *,
    ready_url: str | None = None,
    ready_pattern: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 60.0,
    log_path: Path | None = None,
    die_with_parent: bool = False,
) -> RunningProcess:
    """Start ``cmd`` and return once it is ready (see the module docstring).

    ``env`` is added to the current environment (not a replacement). ``ready_url`` may contain
    ``{url}``, filled from the ready pattern's first group, e.g. ``ready_url="{url}/health"``.
    """
    full_env = dict(os.environ)
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update(env)
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_bytes(b"")
    popen = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=full_env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_die_with_parent if die_with_parent and sys.platform == "linux" else None,
    )
    proc = RunningProcess(cmd, popen, log_path)
    try:
        deadline = time.monotonic() + timeout
        if ready_pattern is not None:
            proc.match = proc.wait_for_line(ready_pattern, timeout)
        if ready_url is not None:
            if "{url}" in ready_url:
                ready_url = ready_url.format(url=proc.url)
            proc.wait_for_url(ready_url, max(1.0, deadline - time.monotonic()))
    except BaseException:
        proc.stop()
        raise
    return proc


def free_port() -> int:
    """A loopback port that was free a moment ago, for the few servers that must be told their port rather
    than print the one the kernel picked (nginx, a server restarted on the same address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sweetspot(*args: str) -> list[str]:
    """The command line of the ``sweetspot`` CLI installed next to this interpreter (tests use the
    installed entry point on purpose: it is what a user runs)."""
    exe = Path(sys.executable).with_name("sweetspot")
    if not exe.exists():
        raise ProcessError(f"{exe} not found: install the package into this environment (make venv)")
    return [str(exe), *args]


def sweetspot_module(*args: str) -> list[str]:
    """``sweetspot ARGS`` run by this interpreter as ``python -m gateway`` (works from a checkout as well as an
    install: what the demo runs its children with)."""
    return [sys.executable, "-m", "gateway", *args]


@contextmanager
def process_factory() -> Iterator[Callable[..., RunningProcess]]:
    """A factory with the signature of :func:`start_process` that stops everything it started.

    In a conftest::

        @pytest.fixture
        def processes():
            with process_factory() as start:
                yield start
    """
    started: list[RunningProcess] = []

    def start(cmd: Sequence[str], **kwargs: object) -> RunningProcess:
        proc = start_process(cmd, **kwargs)  # type: ignore[arg-type]  # the keywords of start_process
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in reversed(started):
            proc.stop()
