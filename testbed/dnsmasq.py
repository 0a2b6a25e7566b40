"""Start Debian's ``dnsmasq`` as a DNS server the test controls, for the discovery of ``dns+`` upstreams.

It answers from one hosts file only (``--no-resolv --no-hosts --addn-hosts``), on a loopback port picked here
(dnsmasq cannot announce a kernel-picked one), and re-reads that file on SIGHUP: :meth:`Dnsmasq.answer` rewrites
it and waits for dnsmasq to say it read it. A name it has no record for is refused (REFUSED), not forwarded.
When the binary is missing the test fails with how to get it (``make dnsmasq``): a discovery test that does not
run is no evidence.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from gateway.common.processes import RunningProcess, free_port

Start = Callable[..., RunningProcess]


def dnsmasq_binary() -> str:
    binary = shutil.which("dnsmasq") or next(
        (p for p in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq") if Path(p).exists()), None
    )
    if binary is None:
        raise AssertionError("dnsmasq is not installed: make dnsmasq (Debian's dnsmasq-base package)")
    return binary


class Dnsmasq:
    """A running dnsmasq answering from :attr:`hosts`; :attr:`nameserver` is its ``ADDRESS:PORT``."""

    def __init__(self, start: Start, hosts: Path, records: dict[str, list[str]], port: int | None = None) -> None:
        self.start, self.hosts = start, hosts
        self.port = port or free_port()
        self.nameserver = f"127.0.0.1:{self.port}"
        self._write(records)
        self.proc = start(
            [
                dnsmasq_binary(),
                "--keep-in-foreground",
                "--log-facility=-",
                "--conf-file=/dev/null",
                "--pid-file=",
                f"--user={getpass.getuser()}",  # stay this user: it re-reads the hosts file after dropping privileges
                "--no-resolv",
                "--no-hosts",
                f"--addn-hosts={hosts}",
                "--local-ttl=0",
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                f"--port={self.port}",
            ],
            ready_pattern=rf"read {hosts} - \d+ names",
        )

    def answer(self, records: dict[str, list[str]], timeout: float = 10.0) -> None:
        """Answer ``records`` from now on (name -> addresses); returns once dnsmasq has read them."""
        read = self._reads()
        self._write(records)
        os.kill(self.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while self._reads() == read:
            if time.monotonic() > deadline:
                raise AssertionError(f"dnsmasq did not re-read {self.hosts} within {timeout:g}s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.proc.stop()

    def _reads(self) -> int:
        return self.proc.output().count(f"read {self.hosts} - ")

    def _write(self, records: dict[str, list[str]]) -> None:
        lines = [f"{address} {name}" for name, addresses in records.items() for address in addresses]
        tmp = self.hosts.with_suffix(".tmp")
        tmp.write_text("".join(f"{line}\n" for line in lines))
        tmp.replace(self.hosts)
