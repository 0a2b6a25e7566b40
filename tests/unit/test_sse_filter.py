"""The streamed-reply filter: what reaches the client, and what the gateway learns on the way.

The streams are llama-server's and vLLM's own shapes (llama-server's captured from the pinned build in
front of the tiny test model); every case is also fed one byte per read, since the upstream's reads split
events anywhere.
"""

from __future__ import annotations

import json

import pytest

from gateway.control.window import Outcome, SlidingWindow
from gateway.server.admission.limiter import Limiter
from gateway.server.relay.event_streams import MESSAGES_EVENTS, RESPONSES_EVENTS, NamedEventFilter
from gateway.server.relay.measure import RequestTracker
from gateway.server.relay.sse import SSEFilter
from gateway.server.upstream.pool import Upstream
from gateway.telemetry.metrics import GatewayMetrics


def event(payload: dict | str) -> bytes:
    body = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return b"data: " + body.encode() + b"\n\n"


def chat_chunk(delta: dict, finish: str | None = None) -> dict:
    return {
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": 1,
        "id": "chatcmpl-1",
        "model": "m",
        "object": "chat.completion.chunk",
    }


USAGE = {"completion_tokens": 3, "prompt_tokens": 18, "total_tokens": 21}
ROLE = event(chat_chunk({"role": "assistant", "content": None}))
TOKENS = [event(chat_chunk({"content": text})) for text in (" one", " two", " three")]
FINISH = event(chat_chunk({}, "length"))
USAGE_CHUNK = event(
    {"choices": [], "created": 1, "id": "chatcmpl-1", "model": "m", "object": "chat.completion.chunk", "usage": USAGE}
)
DONE = b"data: [DONE]\n\n"
LLAMA_CHAT = [ROLE, *TOKENS, FINISH, USAGE_CHUNK, DONE]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tracker(clock: Clock) -> RequestTracker:
    upstream = Upstream(url="http://u", limiter=Limiter("http://u", 4), window=SlidingWindow(60.0))
    t = RequestTracker(arrived=clock.now, clock=clock, streamed=True)
    t.admit(upstream, clock.now, 0.0)
    return t


def run(
    events: list[bytes],
    *,
    forward_usage: bool,
    bytewise: bool = False,
    together: int = 1,
    first_token_at: int | None = None,
) -> tuple[bytes, RequestTracker, SSEFilter, Clock]:
    """Feed ``events`` ``together`` per read (or one byte per read), the clock moving one second per read."""
    clock = Clock()
    t = tracker(clock)
    sse = SSEFilter(t, clock, forward_usage=forward_usage)
    if bytewise:
        reads = [bytes([b]) for b in b"".join(events)]
    else:
        reads = [b"".join(events[i : i + together]) for i in range(0, len(events), together)]
    out = b""
    for data in reads:
        clock.now += 1.0
        out += sse.feed(data)
    out += sse.flush()
    return out, t, sse, clock


@pytest.mark.parametrize(("bytewise", "together"), [(False, 1), (True, 1), (False, 2), (False, 3), (False, 7)])
def test_the_usage_chunk_is_dropped_unless_asked_for_and_the_usage_is_kept(bytewise: bool, together: int) -> None:
    out, t, sse, _ = run(LLAMA_CHAT, forward_usage=False, bytewise=bytewise, together=together)
    assert out == b"".join([ROLE, *TOKENS, FINISH, DONE])
    assert (t.prompt_tokens, t.output_tokens) == (18, 3)
    assert sse.upstream_error is None

    out, t, _, _ = run(LLAMA_CHAT, forward_usage=True, bytewise=bytewise, together=together)
    assert out == b"".join(LLAMA_CHAT)
    assert t.output_tokens == 3


def test_the_first_token_is_the_first_chunk_with_output_not_the_role_chunk() -> None:
    _, t, _, _ = run(LLAMA_CHAT, forward_usage=False)
    assert t.first_token == 102.0  # read 1 carried the role, read 2 the first token


@pytest.mark.parametrize("together", [1, 2, 3, 6])
def test_without_usage_the_streamed_count_is_the_chunks_that_carried_output(together: int) -> None:
    """An upstream that ignores ``stream_options`` sends no usage: the count from the stream must then be
    exact, closing chunk (no output) excluded, and the sample records it. Events arriving several to a
    read (the closing chunk with ``[DONE]``, say) are counted the same."""
    out, t, _, _ = run([ROLE, *TOKENS, FINISH, DONE], forward_usage=False, together=together)
    assert out == b"".join([ROLE, *TOKENS, FINISH, DONE])
    assert t.output_tokens is None and t.streamed_tokens == 3
    sample = t.finish(Outcome.OK, GatewayMetrics())
    assert sample is not None and sample.output_tokens == 3
    assert t.upstream is not None and t.upstream.window.tokens_total == 3


def test_a_closing_chunk_that_carries_the_last_token_counts_it() -> None:
    """vLLM sends the last token together with ``finish_reason``."""
    last = event(chat_chunk({"content": " four"}, "length"))
    _, t, _, _ = run([ROLE, *TOKENS, last, DONE], forward_usage=False)
    assert t.streamed_tokens == 4


def test_usage_corrects_the_window_to_the_upstreams_count() -> None:
    _, t, _, _ = run(LLAMA_CHAT, forward_usage=False)
    t.finish(Outcome.OK, GatewayMetrics())
    assert t.upstream is not None and t.upstream.window.tokens_total == 3


def test_completions_usage_rides_on_the_last_choices_chunk() -> None:
    """llama-server's /v1/completions puts usage on the closing text chunk: it is kept (it carries the
    choice) and its usage read."""

    def text(value: str, **extra: object) -> bytes:
        return event(
            {"choices": [{"text": value, "index": 0, "finish_reason": None}], "object": "text_completion", **extra}
        )

    events = [text(" a"), text(" b"), text("", usage={"completion_tokens": 2, "prompt_tokens": 2}), DONE]
    out, t, _, _ = run(events, forward_usage=False)
    assert out == b"".join(events)
    assert (t.prompt_tokens, t.output_tokens) == (2, 2)


def test_vllm_continuous_usage_is_read_from_every_chunk() -> None:
    events = [
        event({**chat_chunk({"content": f" t{i}"}), "usage": {"prompt_tokens": 5, "completion_tokens": i}})
        for i in (1, 2, 3)
    ] + [DONE]
    out, t, _, _ = run(events, forward_usage=True)
    assert out == b"".join(events)
    assert t.output_tokens == 3 and t.streamed_tokens == 3


@pytest.mark.parametrize(
    "payload",
    [
        {"error": {"message": "slot died", "type": "server_error", "code": 500}},  # OpenAI / llama-server
        {"object": "error", "message": "slot died", "type": "InternalServerError", "code": 500},  # vLLM
    ],
)
def test_an_error_event_is_passed_on_and_remembered(payload: dict) -> None:
    events = [ROLE, TOKENS[0], event(payload), DONE]
    out, _, sse, _ = run(events, forward_usage=False)
    assert out == b"".join(events)
    assert sse.upstream_error == "slot died"


def test_crlf_line_ends_and_comments_pass_through() -> None:
    events = [e.replace(b"\n", b"\r\n") for e in [b": ping\n\n", *LLAMA_CHAT]]
    out, t, _, _ = run(events, forward_usage=False, bytewise=True)
    assert out == b"".join(events[:-2] + events[-1:])  # the usage chunk is dropped
    assert t.output_tokens == 3


def test_an_unterminated_last_event_is_flushed() -> None:
    out, _, _, _ = run([ROLE, TOKENS[0], b"data: [DONE]"], forward_usage=False)
    assert out.endswith(b"data: [DONE]")


@pytest.mark.parametrize("together", [2, 3])
def test_an_error_event_among_tokens_in_one_read_is_found(together: int) -> None:
    events = [ROLE, TOKENS[0], TOKENS[1], event({"error": {"message": "slot died", "code": 500}}), DONE]
    out, t, sse, _ = run(events, forward_usage=False, together=together)
    assert out == b"".join(events)
    assert sse.upstream_error == "slot died" and t.streamed_tokens == 2


def test_tokens_arriving_together_are_credited_together() -> None:
    _, t, _, _ = run([ROLE, *TOKENS, FINISH, DONE], forward_usage=False, together=2)
    # reads: [role, one] [two, three] [finish, done]: the first token at read 1, the rest counted per read
    assert t.first_token == 101.0 and t.streamed_tokens == 3


def test_reads_with_nothing_dropped_are_passed_on_as_they_are() -> None:
    clock = Clock()
    sse = SSEFilter(tracker(clock), clock, forward_usage=False)
    sse.feed(ROLE + TOKENS[0])
    data = TOKENS[1] + TOKENS[2]
    assert sse.feed(data) is data


@pytest.mark.parametrize(("bytewise", "together"), [(False, 1), (True, 1), (False, 2), (False, 7)])
def test_the_closing_event_marks_the_stream_finished(bytewise: bool, together: int) -> None:
    """A client may close as soon as ``[DONE]`` arrives, before the upstream ends its body: the stream is
    then finished, and the hang-up loses nothing (the reply counts it ok, not client_cancelled)."""
    _, _, sse, _ = run(LLAMA_CHAT, forward_usage=False, bytewise=bytewise, together=together)
    assert sse.finished
    _, _, sse, _ = run(LLAMA_CHAT[:-1], forward_usage=False, bytewise=bytewise, together=together)
    assert not sse.finished
    crlf = [e.replace(b"\n\n", b"\r\n\r\n") for e in LLAMA_CHAT]
    _, _, sse, _ = run(crlf, forward_usage=False, bytewise=bytewise, together=together)
    assert sse.finished
    # Without a usage chunk, the closing event may share a read with token events that nothing is dropped from.
    for events in ([ROLE, *TOKENS, FINISH, DONE], [e.replace(b"\n\n", b"\r\n\r\n") for e in (ROLE, *TOKENS, DONE)]):
        _, _, sse, _ = run(events, forward_usage=False, bytewise=bytewise, together=together)
        assert sse.finished
        _, _, sse, _ = run(events[:-1], forward_usage=False, bytewise=bytewise, together=together)
        assert not sse.finished


def test_the_named_apis_closing_events_mark_the_stream_finished() -> None:
    clock = Clock()
    for table, closing in ((RESPONSES_EVENTS, b"response.completed"), (MESSAGES_EVENTS, b"message_stop")):
        watcher = NamedEventFilter(tracker(clock), clock, table)
        watcher.feed(
            b"event: "
            + (b"response.output_text.delta" if table is RESPONSES_EVENTS else b"content_block_delta")
            + b'\ndata: {"delta":"x"}\n\n'
        )
        assert watcher.seen_token and not watcher.finished
        watcher.feed(b"event: " + closing + b'\ndata: {"type":"' + closing + b'"}\n\n')
        assert watcher.finished
