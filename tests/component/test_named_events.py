"""The Responses API and Anthropic's Messages API through the gateway (``relay/event_streams.py`` and each
route's dialect): their named-event streams reach the client byte for byte while the gateway reads tokens, usage,
errors and response ids off them, and every error the gateway makes is in the client's own API's shape.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.component.conftest import MODEL, Gate, Stage, hang, sse, stream, whole

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024"}


def named(name: str, payload: dict[str, Any], *, crlf: bool = False) -> bytes:
    return sse({"type": name, **payload}, name=name, crlf=crlf)


def response_events(response_id: str = "resp_1", *, crlf: bool = False) -> list[bytes]:
    done = {"id": response_id, "status": "completed", "usage": {"input_tokens": 5, "output_tokens": 3}}
    return [
        named("response.created", {"response": {"id": response_id, "status": "in_progress"}}, crlf=crlf),
        *(named("response.output_text.delta", {"delta": d}, crlf=crlf) for d in ("He", "l", "lo")),
        named("response.completed", {"response": done}, crlf=crlf),
    ]


def message_events() -> list[bytes]:
    start = {"id": "msg_1", "usage": {"input_tokens": 10, "cache_read_input_tokens": 2, "output_tokens": 1}}
    return [
        named("message_start", {"message": start}),
        named("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        named("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        named("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "!"}}),
        b"event: ping\ndata: {}\n\n",
        named("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
        named("message_stop", {}),
    ]


def responses_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "hello", **fields}


def messages_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}], **fields}


@pytest.mark.parametrize("crlf", [False, True])
async def test_a_responses_stream_passes_untouched_and_is_measured(stage: Stage, crlf: bool) -> None:
    upstream = await stage.upstream()
    events = response_events(crlf=crlf)
    upstream.then(stream(*events))
    gw = await stage.gateway(upstream)
    exchange = await gw.request("POST", RESPONSES, json_body=responses_body(stream=True)).done()
    assert exchange.status == 200 and exchange.body == b"".join(events)
    assert "stream_options" not in upstream.posts()[0].json  # these APIs report usage unasked
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 3
    assert gw.metric("sweetspot_prompt_tokens_total", upstream=upstream.url, model=MODEL) == 5
    assert gw.metric("sweetspot_ttft_seconds_count", upstream=upstream.url) == 1
    assert gw.outcomes(upstream) == {"ok": 1}
    gw.assert_settled()


async def test_a_conversation_continues_on_the_upstream_that_holds_it(stage: Stage) -> None:
    """``previous_response_id`` names state one upstream keeps: the follow-up goes there, not where load says."""
    first, holder = await stage.upstream(), await stage.upstream(models=[MODEL, "holder-only"])
    holder.then(stream(*response_events("resp_7")), whole({"id": "resp_8", "usage": {"output_tokens": 1}}))
    gw = await stage.gateway(first, holder)
    opened = await gw.request("POST", RESPONSES, json_body=responses_body(model="holder-only", stream=True)).done()
    assert opened.status == 200
    follow_up = await gw.request("POST", RESPONSES, json_body=responses_body(previous_response_id="resp_7")).done()
    assert follow_up.json()["id"] == "resp_8"
    assert first.posts() == [] and len(holder.posts()) == 2
    # a whole answer's id is remembered too: reading it back goes to the same upstream
    holder.then(whole({"id": "resp_8", "status": "completed"}))
    read = await gw.call("GET", "/v1/responses/resp_8")
    assert read.status == 200 and read.json()["id"] == "resp_8"
    assert [s.path for s in holder.received][-1] == "/v1/responses/resp_8" and first.received == []


async def test_an_unknown_previous_response_goes_wherever_there_is_room(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(whole({"id": "resp_2"}))
    gw = await stage.gateway(upstream)
    exchange = await gw.request("POST", RESPONSES, json_body=responses_body(previous_response_id="resp_x")).done()
    assert exchange.status == 200


@pytest.mark.parametrize(
    "failure",
    [
        named("error", {"code": "server_error", "message": "boom"}),
        named("response.failed", {"response": {"id": "r", "error": {"message": "boom"}, "usage": {}}}),
        named("error", {"code": "server_error"}),
    ],
)
async def test_an_error_event_in_a_responses_stream_is_an_upstream_error(stage: Stage, failure: bytes) -> None:
    upstream = await stage.upstream()
    events = [*response_events()[:2], failure]
    upstream.then(stream(*events))
    gw = await stage.gateway(upstream)
    exchange = await gw.request("POST", RESPONSES, json_body=responses_body(stream=True)).done()
    assert exchange.body == b"".join(events)
    assert gw.outcomes(upstream) == {"upstream_error": 1}


async def test_a_responses_stream_cut_short_ends_with_the_apis_own_error_event(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(*response_events()[:2], end="die"))
    gw = await stage.gateway(upstream)
    exchange = await gw.request("POST", RESPONSES, json_body=responses_body(stream=True)).done()
    head, _, tail = exchange.body.rpartition(b"event: error\n")
    assert head == b"".join(response_events()[:2])
    error = json.loads(tail.removeprefix(b"data: "))
    assert error["type"] == "error" and error["code"] == "upstream_disconnected" and error["param"] is None
    assert gw.outcomes(upstream) == {"upstream_error": 1}


async def test_a_last_named_event_without_its_blank_line_is_still_read(stage: Stage) -> None:
    upstream = await stage.upstream()
    events = response_events()
    upstream.then(stream(*events[:-1], events[-1].rstrip(b"\n")))
    gw = await stage.gateway(upstream)
    exchange = await gw.request("POST", RESPONSES, json_body=responses_body(stream=True)).done()
    assert exchange.body == b"".join(events).rstrip(b"\n")
    assert gw.metric("sweetspot_prompt_tokens_total", upstream=upstream.url, model=MODEL) == 5


async def test_a_messages_stream_passes_untouched_and_counts_anthropics_usage(stage: Stage) -> None:
    upstream = await stage.upstream()
    events = message_events()
    upstream.then(stream(*events))
    gw = await stage.gateway(upstream)
    exchange = gw.request("POST", MESSAGES, json_body=messages_body(stream=True), headers=ANTHROPIC_HEADERS)
    await exchange.done()
    assert exchange.status == 200 and exchange.body == b"".join(events)
    (seen,) = upstream.posts()
    assert seen.headers["anthropic-version"] == "2023-06-01" and seen.headers["anthropic-beta"] == "tools-2024"
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 2
    assert gw.metric("sweetspot_prompt_tokens_total", upstream=upstream.url, model=MODEL) == 12  # cached included
    assert gw.outcomes(upstream) == {"ok": 1}


async def test_events_without_a_name_or_usage_are_passed_on_and_counted_as_nothing(stage: Stage) -> None:
    upstream = await stage.upstream()
    events = [
        b": keep-alive\n\n",
        named("message_start", {"message": {"id": "msg_3", "usage": None}}),
        b"data: {}\n\n",
        named("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        named("message_delta", {"usage": "unknown"}),
        b"event: message_delta\ndata: not json\n\n",
        b"event: message_delta\n\n",
        named("message_stop", {}),
    ]
    upstream.then(stream(*events))
    gw = await stage.gateway(upstream)
    exchange = await gw.request("POST", MESSAGES, json_body=messages_body(stream=True)).done()
    assert exchange.body == b"".join(events)
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 1  # the delta counted
    assert gw.metric("sweetspot_prompt_tokens_total", upstream=upstream.url, model=MODEL) == 0
    assert gw.outcomes(upstream) == {"ok": 1}


async def test_a_newer_servers_message_delta_brings_its_own_input_count(stage: Stage) -> None:
    upstream = await stage.upstream()
    events = message_events()
    events[5] = named("message_delta", {"usage": {"input_tokens": 11, "output_tokens": 2}})
    upstream.then(stream(*events))
    gw = await stage.gateway(upstream)
    await gw.request("POST", MESSAGES, json_body=messages_body(stream=True)).done()
    assert gw.metric("sweetspot_prompt_tokens_total", upstream=upstream.url, model=MODEL) == 11


async def test_a_messages_client_that_closes_at_message_stop_had_the_whole_answer(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(*message_events(), end="hang"))
    gw = await stage.gateway(upstream)
    exchange = gw.request("POST", MESSAGES, json_body=messages_body(stream=True))
    await exchange.wait_for(b"message_stop")
    exchange.hang_up()
    await exchange.done()
    assert gw.outcomes(upstream) == {"ok": 1}
    gw.assert_settled()


async def test_a_whole_message_is_measured_by_anthropics_usage(stage: Stage) -> None:
    upstream = await stage.upstream()
    answer = {"id": "msg_2", "type": "message", "usage": {"input_tokens": 4, "output_tokens": 6}}
    upstream.then(whole(answer))
    gw = await stage.gateway(upstream)
    exchange = await gw.request("POST", MESSAGES, json_body=messages_body()).done()
    assert exchange.json() == answer
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 6


def anthropic_error(exchange) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    payload = exchange.json()
    assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}, payload
    return payload["error"]


async def test_the_gateways_own_errors_on_messages_are_in_anthropics_shape(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, api_keys=["k"])
    unauthorized = await gw.request("POST", MESSAGES, json_body=messages_body()).done()
    assert unauthorized.status == 401 and anthropic_error(unauthorized)["type"] == "authentication_error"
    invalid = await gw.request("POST", MESSAGES, json_body={"model": MODEL}, headers={"x-api-key": "k"}).done()
    assert invalid.status == 400 and anthropic_error(invalid)["type"] == "invalid_request_error"
    missing = await gw.request(
        "POST", MESSAGES, json_body=messages_body(model="other"), headers={"x-api-key": "k"}
    ).done()
    assert missing.status == 404 and anthropic_error(missing)["type"] == "not_found_error"


async def test_overload_on_messages_is_anthropics_529_with_retry_after(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, initial_limit=1, queue_timeout_s=0.05)
    running = gw.request("POST", MESSAGES, json_body=messages_body())
    await upstream.received_count(1)
    overloaded = await gw.request("POST", MESSAGES, json_body=messages_body()).done()
    assert overloaded.status == 529 and anthropic_error(overloaded)["type"] == "overloaded_error"
    assert int(overloaded.headers["retry-after"]) >= 1
    gate.open()
    await running.done()


async def test_a_messages_stream_without_a_first_token_ends_with_anthropics_error_event(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(message_events()[0], end="hang"))
    gw = await stage.gateway(upstream, first_token_timeout_s=0.1)
    exchange = await gw.request("POST", MESSAGES, json_body=messages_body(stream=True)).done()
    head, _, tail = exchange.body.rpartition(b"event: error\n")
    assert head == message_events()[0]
    payload = json.loads(tail.removeprefix(b"data: "))
    assert payload == {
        "type": "error",
        "error": {"type": "api_error", "message": "the upstream produced no token in time"},
    }
    assert gw.outcomes(upstream) == {"timed_out": 1}
    gw.assert_settled()


async def test_an_error_event_in_a_messages_stream_is_an_upstream_error(stage: Stage) -> None:
    upstream = await stage.upstream()
    events = [*message_events()[:3], named("error", {"error": {"type": "overloaded_error", "message": "busy"}})]
    upstream.then(stream(*events))
    gw = await stage.gateway(upstream)
    exchange = await gw.request("POST", MESSAGES, json_body=messages_body(stream=True)).done()
    assert exchange.body == b"".join(events)
    assert gw.outcomes(upstream) == {"upstream_error": 1}


@pytest.mark.parametrize(
    ("route", "body", "answer"),
    [
        (
            "/v1/rerank",
            {"model": MODEL, "query": "q", "documents": ["a", "b"]},
            {"results": [], "usage": {"total_tokens": 9}},
        ),
        (
            "/v1/score",
            {"model": MODEL, "text_1": "a", "text_2": ["b", "c"]},
            {"data": [], "usage": {"prompt_tokens": 7}},
        ),
    ],
)
async def test_rerank_and_score_take_a_permit_and_are_measured(
    stage: Stage, route: str, body: dict[str, Any], answer: dict[str, Any]
) -> None:
    upstream = await stage.upstream()
    upstream.then(whole(answer))
    gw = await stage.gateway(upstream)
    exchange = await gw.request("POST", route, json_body=body).done()
    assert exchange.status == 200 and exchange.json() == answer
    prompt = answer["usage"].get("prompt_tokens", answer["usage"].get("total_tokens"))
    assert gw.metric("sweetspot_prompt_tokens_total", upstream=upstream.url, model=MODEL) == prompt
    assert gw.outcomes(upstream) == {"ok": 1}
    bad = await gw.request("POST", route, json_body={"model": MODEL}).done()
    assert bad.status == 400
