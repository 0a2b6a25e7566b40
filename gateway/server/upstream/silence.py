"""The bound on a stream's silence, kept without a timer per read.

aiohttp's own ``sock_read`` timeout cancels and re-arms a timer on every read of the body: on uvloop that is a
libuv timer started and stopped per streamed chunk, a few microseconds each, which a relay of tens of chunks a
second per stream pays for a bound that almost never fires. :class:`SilenceBound` checks instead, a few times
per bound, whether any byte arrived since its last look (aiohttp's ``StreamReader.total_bytes``, counted as the
connection receives). Bytes received that the relay has not read yet (a slow client behind it, with aiohttp's
reading paused once its buffer is full) are no silence of the upstream either, as aiohttp's own timeout is
dropped while reading is paused.

It never ends a stream early: it ends one only when every look over the last bound found no new byte and
nothing unread, so the upstream has been silent for at least the bound. It can end one late, by up to a look's
interval (:data:`LOOKS_PER_BOUND`: a silence is ended within 1.25 times the bound).
"""

from __future__ import annotations

import asyncio

import aiohttp

#: How many times per bound the silence is looked at: the latest a silence is ended is the bound plus this share.
LOOKS_PER_BOUND = 4


class StreamSilent(aiohttp.ServerTimeoutError):
    """The upstream sent nothing for the bound. A ``TimeoutError``, as aiohttp's own read timeout is."""


class SilenceBound:
    """Ends the read of ``content`` with :class:`StreamSilent` once it has received nothing for ``bound_s``.
    Armed when made; :meth:`cancel` when the body is done with. A body already at its end needs no bound: the
    first look ends the watch."""

    __slots__ = ("_bound_s", "_content", "_handle", "_loop", "_seen", "_since")

    def __init__(self, content: aiohttp.StreamReader, bound_s: float) -> None:
        self._content = content
        self._bound_s = bound_s
        self._loop = asyncio.get_running_loop()
        self._seen = content.total_bytes
        self._since = self._loop.time()  # when the last look saw new bytes (or the watch began)
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self._since + self._step, self._look)

    @property
    def _step(self) -> float:
        return self._bound_s / LOOKS_PER_BOUND

    def _look(self) -> None:
        self._handle = None
        content = self._content
        if content.is_eof() or content.exception() is not None:
            return  # the body has ended (or failed): nothing more to bound
        now = self._loop.time()
        if content.total_bytes != self._seen or _unread(content):
            self._seen, self._since = content.total_bytes, now
        elif now - self._since >= self._bound_s:
            content.set_exception(StreamSilent(f"the upstream sent nothing for {self._bound_s:g} s"))
            return
        self._handle = self._loop.call_at(min(now + self._step, self._since + self._bound_s), self._look)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def _unread(content: aiohttp.StreamReader) -> bool:
    """Whether ``content`` holds bytes the relay has not read yet. aiohttp keeps the count in ``_size`` and
    exposes no public reader of it (``tests/unit/test_silence_bound.py`` fails if that changes)."""
    return content._size > 0
