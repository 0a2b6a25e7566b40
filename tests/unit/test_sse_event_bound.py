"""The bound on one unfinished event: an event that arrives in many reads is passed on whole, one that never
ends raises :class:`EventTooLarge` once it passes the bound (the real process's case is
``tests/integration/test_hardening.py``)."""

from __future__ import annotations

import json

import pytest

from gateway.control.window import SlidingWindow
from gateway.server.admission.limiter import Limiter
from gateway.server.relay.event_streams import RESPONSES_EVENTS, NamedEventFilter
from gateway.server.relay.measure import RequestTracker
from gateway.server.relay.sse import EventTooLarge, SSEFilter
from gateway.server.upstream.pool import Upstream


def tracker() -> RequestTracker:
    upstream = Upstream(url="http://u", limiter=Limiter("http://u", 4), window=SlidingWindow(60.0))
    t = RequestTracker(arrived=0.0, clock=lambda: 0.0, streamed=True)
    t.admit(upstream, 0.0, 0.0)
    return t


def big_event(size: int, separator: bytes) -> bytes:
    payload = {"choices": [{"index": 0, "delta": {"content": "x" * size}}]}
    return b"data: " + json.dumps(payload).encode() + separator


@pytest.mark.parametrize("separator", [b"\n\n", b"\r\n\r\n"])
@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_an_event_in_many_reads_under_the_bound_is_passed_on_whole(separator: bytes, piece: int) -> None:
    event = big_event(20_000, separator)
    sse = SSEFilter(tracker(), lambda: 0.0, forward_usage=False, max_event_bytes=len(event))
    out = b"".join(sse.feed(event[i : i + piece]) for i in range(0, len(event), piece)) + sse.flush()
    assert out == event and sse.seen_token


@pytest.mark.parametrize("piece", [1000, 64 * 1024])
def test_a_chat_event_that_never_ends_raises_past_the_bound_and_passes_nothing_on(piece: int) -> None:
    bound = 256 * 1024
    sse = SSEFilter(tracker(), lambda: 0.0, forward_usage=False, max_event_bytes=bound)
    sent = 0
    with pytest.raises(EventTooLarge) as raised:
        assert sse.feed(b'data: {"choices": [') == b""
        while sent <= 2 * bound:
            assert sse.feed(b"x" * piece) == b""
            sent += piece
    assert raised.value.limit == bound and bound - piece <= sent <= bound  # raised by the read past it


def test_a_named_event_that_never_ends_is_passed_on_until_the_bound() -> None:
    bound = 100_000
    watcher = NamedEventFilter(tracker(), lambda: 0.0, RESPONSES_EVENTS, max_event_bytes=bound)
    start = b'event: response.completed\ndata: {"response": {"output": "'
    assert watcher.feed(start) == start
    piece = b"y" * 10_000
    with pytest.raises(EventTooLarge):
        for _ in range(20):
            assert watcher.feed(piece) is piece
