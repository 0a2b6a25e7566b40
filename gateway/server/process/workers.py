"""``sweetspot serve --workers N``: N worker processes on one port, each a whole gateway.

One Python process streams at most one core's worth of chunks, less than a large GPU server sends at
high concurrency. The parent reserves the port (bound, never listening, so ``--port 0`` still picks one
port for all), forks the workers, and each binds and listens on that port with ``SO_REUSEPORT``: the
kernel spreads new connections over the listening sockets, so no worker wakes for another's accept.
Each worker builds its own app after the fork (no event loop, thread or pooled connection crosses it)
and runs its own controllers: an independent replica, exactly as several pods are.

Signals: the workers run in their own process groups, so a Ctrl-C at a terminal, or a signal to the
parent's group, reaches the parent only. The parent turns the first SIGTERM or SIGINT into one SIGTERM per
worker, each of which drains (see :class:`gateway.common.asgi_server.DrainingServer`), waits for them, and
exits 0 once every worker exited 0. A second signal becomes SIGQUIT, which stops the workers at once. SIGHUP
(re-read the upstreams) is forwarded to every worker as it is; a worker ignores it until its app is up.

A worker may still get the stop twice: systemd (its default ``KillMode=control-group``) sends SIGTERM to
every process of the unit, so a worker gets the unit's and then the parent's forward of it, and a process
group is no shelter from that. A repeated SIGTERM cannot say who sent it (Python's handlers get no sender),
so a worker drains on the first, whoever sends it, and ignores the rest; "stop at once" is a signal of its
own, SIGQUIT, that only the parent sends.

A worker that dies on its own takes the others down with it (SIGTERM, so they drain) and the parent exits 1:
the supervisor restarts the whole unit, rather than the host running on fewer workers nobody notices.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType

READY = b"r"


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Bind ``host:port`` with ``SO_REUSEPORT`` without listening: the port is held (and chosen, for
    port 0) but gets no connections; only the workers' listening sockets do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock, sock.getsockname()[1]


def run_workers(count: int, worker: Callable[[int, int], None], *, announce: Callable[[], None]) -> int:
    """Fork ``count`` workers, each running ``worker(index, ready_fd)`` (it writes :data:`READY` to
    ``ready_fd`` once it listens, then serves until it drained), call ``announce`` once all are ready,
    and supervise them. Returns the parent's exit status."""
    read_fd, write_fd = os.pipe()
    pids: dict[int, int] = {}
    for index in range(count):
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(read_fd)
            os.setpgid(0, 0)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the app's own handler (gateway.server.app)
            status = 0
            try:
                worker(index, write_fd)
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - a worker must not return into the parent's code
                import traceback

                traceback.print_exc()
                status = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)
        pids[pid] = index
    os.close(write_fd)
    return _supervise(pids, read_fd, announce)


def _supervise(pids: dict[int, int], read_fd: int, announce: Callable[[], None]) -> int:
    signals_seen = 0  # the operator's signals: the first drains the workers, a second stops them at once
    stopping = False  # the workers were told to drain because one of them failed

    def forward(sig: int, frame: FrameType | None) -> None:
        nonlocal signals_seen
        signals_seen += 1
        _signal_all(pids, signal.SIGTERM if signals_seen == 1 else signal.SIGQUIT)

    def hangup(sig: int, frame: FrameType | None) -> None:
        _signal_all(pids, signal.SIGHUP)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, hangup)
    try:
        ready = 0
        while ready < len(pids):
            try:
                chunk = os.read(read_fd, len(pids) - ready)
            except InterruptedError:
                continue
            if not chunk:
                break  # every worker closed its end: some died before they listened
            ready += chunk.count(READY)
        os.close(read_fd)
        if ready == len(pids) and not signals_seen:
            announce()
        failed = stopping = ready < len(pids)
        if failed:
            _signal_all(pids, signal.SIGTERM)
        while pids:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            pids.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            if code != 0 or not (signals_seen or stopping):
                failed = True
                if not (signals_seen or stopping):
                    print(f"sweetspot: worker {pid} exited ({code}); stopping the others", file=sys.stderr, flush=True)
                    stopping = True
                    _signal_all(pids, signal.SIGTERM)
        return 1 if failed else 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_all(pids: dict[int, int], sig: int) -> None:
    for pid in list(pids):
        with contextlib.suppress(ProcessLookupError):  # it has exited already
            os.kill(pid, sig)
