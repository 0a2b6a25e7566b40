"""Run llama-server as a child process for benchmarks and scripts: start it, wait until it serves, stop it.

Tests start servers through ``tests/support`` (fixtures that fail with the process output); the scripts in
``bench/`` cannot import the tests, so this module does the same for them, with the same command line
(:class:`~gateway.testing.llama_server.LlamaServerConfig`) and the same readiness rule: llama-server prints
``listening on http://...`` only once the model is loaded, and ``/health`` then answers 200.

:func:`start_near_free_server` runs a model so small that a decode step costs next to nothing: what a
benchmark of the *gateway* wants upstream, so that the proxy's own CPU, not the model, decides the numbers.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque

from gateway.testing.llama_server import LlamaServerConfig, find_binary
from gateway.testing.tiny_gguf import TinyModelSpec, ensure_model

LISTENING = re.compile(r"listening on (http://\S+)")

#: 2 layers of width 64 (about 0.1M parameters with the 440-token vocabulary): a decode step takes
#: microseconds, so per-request costs are HTTP, JSON and scheduling, as for a gateway benchmark they must be.
NEAR_FREE_MODEL = TinyModelSpec(n_embd=64, n_layer=2, n_head=2, n_head_kv=2, n_ff=128)
NEAR_FREE_ALIAS = "near-free"


class LlamaServerStartError(RuntimeError):
    """llama-server exited or did not become ready; the message carries the tail of its output."""


class LlamaServerProcess:
    """A running llama-server: its ``url``, its recent ``output()``, and ``stop()`` (idempotent)."""

    def __init__(self, cmd: list[str], popen: subprocess.Popen[bytes]) -> None:
        self.cmd = cmd
        self.popen = popen
        self.url: str | None = None
        self._lines: deque[str] = deque(maxlen=400)
        self._listening = threading.Event()
        # Always drain the output: a child blocked on a full pipe would stall mid-benchmark.
        self._reader = threading.Thread(target=self._read, name="llama-server output", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return "".join(self._lines)

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in iter(self.popen.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            self._lines.append(line)
            if self.url is None:
                match = LISTENING.search(line)
                if match:
                    self.url = match.group(1)
                    self._listening.set()
        self._listening.set()  # EOF: wake a waiter so it sees the exit

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        if not self._listening.wait(timeout_s) or self.url is None:
            raise LlamaServerStartError(self._why("printed no 'listening on' line"))
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise LlamaServerStartError(self._why(f"exited with code {self.popen.returncode}"))
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise LlamaServerStartError(self._why(f"{self.url}/health did not answer 200 within {timeout_s:.0f}s"))

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the process group, then SIGKILL it if it lingers."""
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout_s)
        self._reader.join(timeout_s)
        return self.popen.returncode

    def _why(self, what: str) -> str:
        tail = "".join(list(self._lines)[-40:])
        return f"{' '.join(self.cmd)}: {what}\n--- output ---\n{tail}"

    def __enter__(self) -> LlamaServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def start_server(config: LlamaServerConfig, *, timeout_s: float = 120.0) -> LlamaServerProcess:
    """Start llama-server with ``config`` (``port=0``: it picks one) and return once it serves."""
    cmd = config.command(find_binary())
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    proc = LlamaServerProcess(cmd, popen)
    try:
        proc.wait_ready(timeout_s)
    except BaseException:
        proc.stop()
        raise
    return proc


def start_near_free_server(parallel: int = 32, *, threads: int = 1, ctx_per_slot: int = 512,
                           http_threads: int | None = None) -> tuple[LlamaServerProcess, str]:
    """llama-server on :data:`NEAR_FREE_MODEL` with ``parallel`` slots; returns ``(process, url)``.

    One thread by default: on a 2-core machine a second ggml thread buys nothing for a model this small
    and would spin against the gateway being measured for the other core. ``http_threads``: llama-server
    serves each open connection on a thread of its own (``parallel`` + 2 of them by default), and an idle
    kept-alive connection holds its thread for seconds; several proxies' pools in front of one server
    need more than the default, or one's idle connections starve the next one's requests.
    """
    extra = ("--threads-http", str(http_threads)) if http_threads else ()
    config = LlamaServerConfig(model=ensure_model(NEAR_FREE_MODEL), port=0, parallel=parallel,
                               ctx_per_slot=ctx_per_slot, threads=threads, alias=NEAR_FREE_ALIAS, extra=extra)
    proc = start_server(config)
    assert proc.url is not None
    return proc, proc.url
