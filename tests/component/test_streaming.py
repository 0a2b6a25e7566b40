"""Streamed answers (``gateway.server.relay.streaming`` and ``relay/sse.py``): passed on as they arrive, measured on
the way, and ended cleanly, once, whatever happens (the upstream request closed, the permit back, one sample).

The fake upstream stops at gates the test opens, so "as they arrive" is shown, not assumed: what is behind a
closed gate has not reached the client.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from aiohttp import web

from tests.component.conftest import (
    DONE,
    MODEL,
    ROLE,
    STOP,
    Behaviour,
    FakeUpstream,
    Gate,
    Seen,
    Stage,
    sse,
    stream,
    token,
    until,
    usage,
)


async def test_a_stream_reaches_the_client_as_the_upstream_sends_it(stage: Stage) -> None:
    upstream = await stage.upstream()
    first, second = Gate(), Gate()
    upstream.then(stream(ROLE, token("Hel"), first, token("lo"), second, STOP, usage(3, 2), DONE))
    gw = await stage.gateway(upstream)

    exchange = gw.chat(stream=True, headers={"x-request-id": "s-1"})
    await exchange.started()
    assert exchange.status == 200
    assert exchange.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert exchange.headers["cache-control"] == "no-cache" and exchange.headers["x-accel-buffering"] == "no"
    assert exchange.headers["x-request-id"] == "s-1"
    assert re.fullmatch(r"0\.\d{3}", exchange.headers["x-sweetspot-queue-seconds"])
    await exchange.wait_for(b'"Hel"')
    assert b'"lo"' not in exchange.body  # still behind the upstream's gate
    first.open()
    await exchange.wait_for(b'"lo"')
    assert b"[DONE]" not in exchange.body
    second.open()
    await exchange.done()

    assert exchange.body == ROLE + token("Hel") + token("lo") + STOP + DONE  # the usage chunk, unasked, dropped
    (seen,) = upstream.posts()
    assert seen.json["stream_options"] == {"include_usage": True}  # asked of the upstream on the client's behalf
    assert gw.outcomes(upstream) == {"ok": 1}
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 2
    assert gw.metric("sweetspot_prompt_tokens_total", upstream=upstream.url, model=MODEL) == 3
    for histogram in ("ttft", "upstream_ttft", "tpot", "e2e"):
        assert gw.metric(f"sweetspot_{histogram}_seconds_count", upstream=upstream.url) == 1, histogram
    gw.assert_settled()


async def test_a_client_that_asked_for_usage_gets_the_usage_chunk(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), STOP, usage(3, 1), DONE))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True, stream_options={"include_usage": True}).done()
    assert exchange.body == ROLE + token("a") + STOP + usage(3, 1) + DONE
    assert upstream.posts()[0].json["stream_options"] == {"include_usage": True}


async def test_other_stream_options_are_kept_when_usage_is_asked_for(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), usage(3, 1), DONE))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True, stream_options={"continuous_usage_stats": True}).done()
    assert exchange.body == ROLE + token("a") + DONE
    assert upstream.posts()[0].json["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}


async def test_chunks_that_carry_a_null_usage_as_openai_sends_them_are_counted_and_kept(stage: Stage) -> None:
    """OpenAI's own streams, asked for usage, carry ``"usage": null`` on every chunk: only the last usage counts."""
    upstream = await stage.upstream()
    chunks = [sse({"choices": [{"index": 0, "delta": {"content": c}}], "usage": None}) for c in ("a", "b", "c")]
    upstream.then(stream(*chunks, usage(4, 3), DONE))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True).done()
    assert exchange.body == b"".join(chunks) + DONE
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 3
    assert gw.metric("sweetspot_prompt_tokens_total", upstream=upstream.url, model=MODEL) == 4


async def test_without_usage_the_tokens_are_counted_and_the_closing_chunk_taken_back(stage: Stage) -> None:
    """Past the first token events are counted, not parsed; the last one, which carried no token, is taken back."""
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), token("b"), token("c") + token("d"), STOP, DONE))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True).done()
    assert exchange.events()[-1] == "[DONE]"
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 4


async def test_a_stream_that_ends_on_a_token_keeps_its_count(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), token("b")))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True).done()
    assert exchange.body == ROLE + token("a") + token("b")
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 2
    assert gw.outcomes(upstream) == {"ok": 1}


async def test_the_closing_event_alone_in_a_read_ends_the_stream(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(stream(ROLE, token("a"), gate, DONE, end="hang"))
    gw = await stage.gateway(upstream)
    exchange = gw.chat(stream=True)
    await exchange.wait_for(b'"a"')
    gate.open()
    await exchange.wait_for(b"[DONE]")
    exchange.hang_up()  # the upstream's body is still open: only [DONE] says the answer was whole
    await exchange.done()
    assert gw.outcomes(upstream) == {"ok": 1}


async def test_an_event_split_across_reads_is_passed_on_whole(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    split = token("bb")
    head = Gate()
    upstream.then(stream(ROLE[:12], head, ROLE[12:] + token("a") + split[:20], gate, split[20:], DONE))
    gw = await stage.gateway(upstream)
    exchange = gw.chat(stream=True)
    await exchange.started()
    assert exchange.body == b""  # a part of an event alone: nothing to pass on yet
    head.open()
    await exchange.wait_for(b'"a"')
    assert exchange.body == ROLE + token("a")  # the half event is held back
    gate.open()
    await exchange.done()
    assert exchange.body == ROLE + token("a") + split + DONE


async def test_a_last_event_without_its_blank_line_is_still_delivered(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), b"data: [DONE]"))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True).done()
    assert exchange.body == ROLE + token("a") + b"data: [DONE]"


async def test_crlf_framed_streams_are_followed(stage: Stage) -> None:
    upstream = await stage.upstream()
    role = ROLE.replace(b"\n", b"\r\n")
    upstream.then(stream(role, token("a", crlf=True), token("b", crlf=True), b"data: [DONE]\r\n\r\n"))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True).done()
    assert exchange.events()[1:] == [json.loads(token("a")[6:]), json.loads(token("b")[6:]), "[DONE]"]
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 2
    assert gw.metric("sweetspot_ttft_seconds_count", upstream=upstream.url) == 1


async def test_comments_and_odd_events_pass_through_untouched(stage: Stage) -> None:
    upstream = await stage.upstream()
    odd = [
        b": keep-alive\n\n",
        b"event: ping\n\n",
        b"data: not json\n\n",
        b"data: [1, 2]\n\n",
        sse({"choices": ["not an object"]}),
        sse({"choices": [{"index": 0}]}),
    ]
    upstream.then(stream(*odd, token("a"), DONE))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True).done()
    assert exchange.body == b"".join(odd) + token("a") + DONE
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 1


@pytest.mark.parametrize(
    "delta",
    [{"reasoning_content": "hmm"}, {"reasoning": "hmm"}, {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}],
)
async def test_reasoning_and_tool_calls_are_first_tokens(stage: Stage, delta: dict) -> None:
    upstream = await stage.upstream()
    first = sse({"choices": [{"index": 0, "delta": delta}]})
    upstream.then(stream(ROLE, first, DONE))
    gw = await stage.gateway(upstream)
    await gw.chat(stream=True).done()
    assert gw.metric("sweetspot_ttft_seconds_count", upstream=upstream.url) == 1


async def test_a_stream_with_no_token_at_all_has_no_first_token(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, STOP, usage(3, 0), DONE))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True).done()
    assert exchange.body == ROLE + STOP + DONE
    assert gw.metric("sweetspot_ttft_seconds_count", upstream=upstream.url) == 0
    assert gw.outcomes(upstream) == {"ok": 1}


async def test_a_completions_stream_counts_its_text_tokens(stage: Stage) -> None:
    upstream = await stage.upstream()
    text = [sse({"object": "text_completion", "choices": [{"index": 0, "text": t}]}) for t in ("x", "y", "z")]
    upstream.then(stream(*text, usage(2, 3), DONE))
    gw = await stage.gateway(upstream)
    exchange = await gw.request(
        "POST", "/v1/completions", json_body={"model": MODEL, "prompt": "p", "stream": True}
    ).done()
    assert exchange.body == b"".join(text) + DONE
    assert upstream.posts()[0].json["stream_options"] == {"include_usage": True}
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 3


@pytest.mark.parametrize(
    "error_event",
    [
        sse({"error": {"message": "out of memory", "type": "server_error", "code": 500}}),
        sse({"error": "out of memory"}),
        sse({"object": "error", "message": "out of memory", "type": "InternalServerError", "code": 500}),
    ],
)
async def test_an_error_inside_the_stream_reaches_the_client_and_counts_as_an_upstream_error(
    stage: Stage, error_event: bytes
) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), error_event, DONE))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True).done()
    assert exchange.body == ROLE + token("a") + error_event + DONE
    assert gw.outcomes(upstream) == {"upstream_error": 1}
    gw.assert_settled()


# --- a stream that ends early -----------------------------------------------------------------------------


def error_event_of(exchange) -> dict:  # type: ignore[no-untyped-def]
    last = exchange.events()[-1]
    assert set(last) == {"error"} and set(last["error"]) == {"message", "type", "param", "code"}, last
    return last["error"]


async def test_no_first_token_in_time_ends_the_stream_with_an_error_event(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, end="hang"))
    gw = await stage.gateway(upstream, first_token_timeout_s=0.1)
    exchange = await gw.chat(stream=True).done()
    assert exchange.status == 200
    assert exchange.body.startswith(ROLE)
    error = error_event_of(exchange)
    assert (error["type"], error["code"]) == ("timeout_error", "upstream_timeout")
    await upstream.wait(lambda: upstream.posts()[0].aborted)  # the generation was cut upstream
    assert gw.outcomes(upstream) == {"timed_out": 1}
    gw.assert_settled()


async def test_the_first_token_deadline_is_lifted_once_a_token_came(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(stream(ROLE, token("a"), gate, token("b"), DONE))
    gw = await stage.gateway(upstream, first_token_timeout_s=0.2)
    exchange = gw.chat(stream=True)
    await exchange.wait_for(b'"a"')
    await asyncio.sleep(0.25)  # past the first-token deadline, with the first token in hand
    gate.open()
    await exchange.done()
    assert exchange.body == ROLE + token("a") + token("b") + DONE


def after(gate: Gate, behaviour: Behaviour) -> Behaviour:
    """``behaviour``, begun (its head sent) only once ``gate`` opens."""

    async def answer(request: web.Request, seen: Seen, upstream: FakeUpstream) -> web.StreamResponse:
        await gate.wait()
        return await behaviour(request, seen, upstream)

    return answer


async def test_one_deadline_covers_the_head_and_the_first_token(stage: Stage) -> None:
    """The head and the first token are due together within first_token_timeout_s of the request going
    upstream, under one timer: a first token within that time of the head, but past the deadline, is late."""
    upstream = await stage.upstream()
    head, first = Gate(), Gate()
    upstream.then(after(head, stream(ROLE, first, token("late"), DONE)))
    gw = await stage.gateway(upstream, first_token_timeout_s=0.3)
    exchange = gw.chat(stream=True)
    await upstream.received_count(1)
    await asyncio.sleep(0.15)
    head.open()  # within the deadline
    await asyncio.sleep(0.25)  # past it, counted from before the head (not past 0.3 s from the head)
    first.open()
    await exchange.done()
    assert b'"late"' not in exchange.body
    if exchange.status == 200:  # the head came in time (on a slow machine it may not have: a 504 then)
        assert exchange.body.startswith(ROLE)
        assert error_event_of(exchange)["code"] == "upstream_timeout"
    else:
        assert exchange.status == 504 and exchange.error()["code"] == "upstream_timeout"
    assert gw.outcomes(upstream) == {"timed_out": 1}
    gw.assert_settled()


async def test_a_stream_that_goes_silent_ends_with_an_error_event(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), end="hang"))
    gw = await stage.gateway(upstream, stream_idle_timeout_s=0.1)
    exchange = await gw.chat(stream=True).done()
    assert exchange.body.startswith(ROLE + token("a"))
    error = error_event_of(exchange)
    assert error["code"] == "upstream_timeout" and "silent" in error["message"]
    assert gw.outcomes(upstream) == {"timed_out": 1}
    gw.assert_settled()


async def test_an_upstream_that_dies_mid_stream_ends_it_with_an_error_event(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), end="die"))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True).done()
    assert exchange.body.startswith(ROLE + token("a"))
    error = error_event_of(exchange)
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_disconnected")
    assert "mid-stream" in error["message"] and upstream.url not in error["message"]
    assert gw.outcomes(upstream) == {"upstream_error": 1}
    assert len(upstream.posts()) == 1  # never sent again: it was running
    gw.assert_settled()


async def test_a_client_that_hangs_up_mid_stream_aborts_the_upstream_and_frees_the_permit(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(stream(ROLE, token("a"), gate, token("b"), DONE))
    gw = await stage.gateway(upstream)
    exchange = gw.chat(stream=True)
    await exchange.wait_for(b'"a"')
    assert gw.inflight() == 1

    exchange.hang_up()
    await exchange.done()

    (seen,) = upstream.posts()
    await upstream.wait(lambda: seen.aborted)
    assert gw.outcomes(upstream) == {"client_cancelled": 1}
    assert gw.metric("sweetspot_e2e_seconds_count", upstream=upstream.url) == 0  # not a completed request
    gw.assert_settled()


async def test_a_client_that_closes_at_done_had_the_whole_answer(stage: Stage) -> None:
    """A client may close as soon as ``[DONE]`` arrives, before the upstream ends its body: a whole answer, counted
    ok, with the usage it carried, and the permit back at the hang-up rather than at the upstream's end."""
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), STOP, usage(3, 1), DONE, end="hang"))
    gw = await stage.gateway(upstream)
    exchange = gw.chat(stream=True)
    await exchange.wait_for(b"[DONE]")
    exchange.hang_up()
    await exchange.done()
    assert gw.outcomes(upstream) == {"ok": 1}
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 1
    gw.assert_settled()


async def test_a_client_that_closes_at_done_after_an_error_event_is_an_upstream_error(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), sse({"error": {"message": "boom"}}), DONE, end="hang"))
    gw = await stage.gateway(upstream)
    exchange = gw.chat(stream=True)
    await exchange.wait_for(b"[DONE]")
    exchange.hang_up()
    await exchange.done()
    assert gw.outcomes(upstream) == {"upstream_error": 1}
    gw.assert_settled()


async def test_a_request_cancelled_by_its_server_still_returns_its_permit(stage: Stage) -> None:
    """A server that gives up on a request (uvicorn at the end of its graceful shutdown) cancels its task: the
    cancellation propagates, and the clean-up runs anyway."""
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(stream(ROLE, token("a"), gate, DONE))
    gw = await stage.gateway(upstream)
    exchange = gw.chat(stream=True)
    await exchange.wait_for(b'"a"')
    exchange.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await exchange.task
    (seen,) = upstream.posts()
    await upstream.wait(lambda: seen.aborted)
    assert gw.outcomes(upstream) == {"client_cancelled": 1}
    gw.assert_settled()


async def test_a_request_cancelled_by_its_server_while_queued_never_takes_a_permit(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(stream(ROLE, gate, DONE))
    gw = await stage.gateway(upstream, initial_limit=1)
    running = gw.chat(stream=True)
    await upstream.received_count(1)
    queued = gw.chat(stream=True)
    await until(lambda: gw.parts.queue.depth == 1)
    queued.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued.task
    gate.open()
    await running.done()
    assert len(upstream.posts()) == 1
    gw.assert_settled()
