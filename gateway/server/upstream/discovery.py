"""Where the upstream list comes from while the gateway runs: the configured ``upstreams`` united with those of
``upstreams_file``, a file anything can write (a Kubernetes ConfigMap, a sidecar, consul-template).

The file lists one base URL a line; ``#`` starts a comment, blank lines are skipped, a trailing ``/`` is
dropped, a URL listed twice counts once. A ``dns+http://`` or ``dns+https://`` line is a name whose addresses are
the upstreams (:mod:`gateway.server.upstream.dns_discovery`)::

    # the vLLM servers of pool A
    http://vllm-0.vllm:8000
    http://vllm-1.vllm:8000   # added for the launch
    dns+http://vllm.pool-b.svc.cluster.local:8000

A file that cannot be read, or that holds a line which is none of these, changes
nothing: one log line says why and the last good list stays (an editor's half-written file must never empty the
pool). :class:`UpstreamsFile` notices a change by the file's mtime and size, and reads it only then; what it
read counts only when its content differs from the last good one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from gateway.server.upstream.dns_discovery import is_dns, parse_dns_name

log = logging.getLogger("sweetspot.upstreams")


class BadUpstreamsFile(ValueError):
    """A file whose content cannot be a list of upstreams (the message names the line)."""


def check_upstream(entry: str) -> str:
    """``entry`` without a trailing ``/`` when it is an ``http(s)://host[:port][/path]`` base URL or a name to
    resolve, ``dns+http(s)://name:port[/path]`` (:mod:`gateway.server.upstream.dns_discovery`); ValueError saying
    what is wrong otherwise. The one rule for ``upstreams`` and for the lines of ``upstreams_file``."""
    if is_dns(entry):
        return parse_dns_name(entry).entry
    try:
        parts = urlsplit(entry)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is no number
        valid = False
    if not valid or parts.query or parts.fragment or any(ch.isspace() for ch in entry):
        raise ValueError(f"not an http://, https://, dns+http:// or dns+https:// base URL: {entry!r}")
    return entry.rstrip("/")


def parse_upstreams(text: str) -> list[str]:
    """The upstreams ``text`` lists, in order, each once. Raises :class:`BadUpstreamsFile` for a line that is
    not an ``http(s)://host[:port][/path]`` URL or a ``dns+http(s)://name:port[/path]`` name."""
    urls: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if any(ch.isspace() for ch in entry):
            raise BadUpstreamsFile(f"line {number}: one URL a line, got {entry!r}")
        try:
            url = check_upstream(entry)
        except ValueError as exc:
            raise BadUpstreamsFile(f"line {number}: {exc}") from None
        if url not in urls:
            urls.append(url)
    return urls


def united(*lists: Iterable[str]) -> list[str]:
    """Every URL of ``lists``, in order of first appearance, each once, without a trailing ``/``."""
    out: list[str] = []
    for urls in lists:
        for url in urls:
            url = url.rstrip("/")
            if url not in out:
                out.append(url)
    return out


class Change(NamedTuple):
    """What turns the upstreams serving now into those wanted."""

    added: list[str]
    removed: list[str]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


def diff(current: Iterable[str], wanted: Iterable[str]) -> Change:
    """The upstreams of ``wanted`` not in ``current`` (in ``wanted``'s order), and those of ``current`` not in
    ``wanted`` (in ``current``'s order)."""
    now, then = list(current), list(wanted)
    have, want = set(now), set(then)
    return Change([url for url in then if url not in have], [url for url in now if url not in want])


class UpstreamsFile:
    """``upstreams_file``, read again when it changed. :attr:`urls` is the last good list it held."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.urls: list[str] = []
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of the last read, good or not

    def load(self) -> list[str]:
        """Read it now (at start-up): raises when it cannot be read or parsed, so a bad file stops the start."""
        stat = self.path.stat()
        self.urls = parse_upstreams(self.path.read_text(encoding="utf-8"))
        self._seen = (stat.st_mtime_ns, stat.st_size)
        return self.urls

    def poll(self, *, force: bool = False) -> list[str] | None:
        """The file's new list when it changed since the last read (or, with ``force``, whenever it reads
        differently from the last good list); None when it did not, or when it cannot be read or parsed (logged
        once per change, the last good list kept)."""
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            if self._seen != (-1, -1):
                log.error("upstreams_file %s cannot be read (%s); keeping the last good list", self.path, exc)
                self._seen = (-1, -1)
            return None
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen == self._seen and not force:
            return None
        self._seen = seen
        try:
            urls = parse_upstreams(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, BadUpstreamsFile) as exc:
            log.error("upstreams_file %s: %s; keeping the last good list", self.path, exc)
            return None
        if urls == self.urls:
            return None
        self.urls = urls
        return urls
