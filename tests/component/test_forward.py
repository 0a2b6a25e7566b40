"""One generation request's path through the app (``gateway.server.routes.forward``): what is refused before it
takes a queue place, and what a whole answer looks like on the way back.

Each refusal is checked for what the client reads (status, OpenAI's error shape, the headers) and for what it
must not cost: the upstream never sees a refused request, and no permit is left behind.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from gateway.server.app import create_app
from gateway.server.routes.table import ROUTES
from tests.component.conftest import (
    CHAT,
    MODEL,
    Gate,
    Stage,
    chat_answer,
    hang,
    raw,
    stream,
    until,
    whole,
)

KEY = "client-key"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
async def test_a_whole_answer_passes_through_with_the_gateways_headers(stage: Stage, route: str) -> None:
    upstream = await stage.upstream()
    answer = {"id": "x", "object": "list", "data": [{"embedding": [0.5]}], "usage": {"prompt_tokens": 2}}
    upstream.then(whole(answer))
    gw = await stage.gateway(upstream)
    body = {"model": MODEL, "messages": CHAT, "prompt": "p", "input": "i"}
    request = json.dumps(body).encode()

    exchange = await gw.call("POST", route, body=request)

    assert exchange.status == 200 and exchange.json() == answer
    assert exchange.headers["content-type"].startswith("application/json")
    assert re.fullmatch(r"0\.\d{3}", exchange.headers["x-sweetspot-queue-seconds"])  # admitted at once
    (seen,) = upstream.posts(route)
    assert seen.body == request  # the client's bytes, untouched
    assert seen.headers["x-request-id"] == exchange.headers["x-request-id"]
    assert len(exchange.headers["x-request-id"]) == 32  # made by the gateway: the client sent none
    assert gw.metric("sweetspot_requests_total", route=route, status="200", model=MODEL) == 1
    assert gw.metric("sweetspot_prompt_tokens_total", upstream=upstream.url, model=MODEL) == 2
    assert gw.outcomes(upstream) == {"ok": 1}
    gw.assert_settled()


async def test_usage_of_a_whole_answer_is_counted(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(whole(chat_answer(prompt=7, completion=5)))
    gw = await stage.gateway(upstream)
    assert (await gw.chat().done()).status == 200
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 5
    assert gw.metric("sweetspot_request_output_tokens_sum", upstream=upstream.url, model=MODEL) == 5
    assert gw.metric("sweetspot_e2e_seconds_count", upstream=upstream.url) == 1
    assert gw.metric("sweetspot_queue_wait_seconds_count", outcome="admitted", priority="standard") == 1


async def test_an_answer_that_is_not_json_passes_through_as_it_is(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(raw(200, b"plain words", content_type="text/plain"))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat().done()
    assert exchange.status == 200 and exchange.body == b"plain words"
    assert exchange.headers["content-type"].startswith("text/plain")
    assert gw.outcomes(upstream) == {"ok": 1}


@pytest.mark.parametrize(("status", "outcome"), [(400, "client_error"), (404, "client_error"), (422, "client_error")])
async def test_an_upstreams_own_client_error_reaches_the_client_as_it_is(stage: Stage, status: int, outcome: str):
    upstream = await stage.upstream()
    error = {"error": {"message": "max_tokens too large", "type": "invalid_request_error", "param": None, "code": 1}}
    upstream.then(whole(error, status=status))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat().done()
    assert exchange.status == status and exchange.json() == error
    assert gw.outcomes(upstream) == {outcome: 1}
    assert len(upstream.posts()) == 1
    gw.assert_settled()


async def test_a_streamed_request_answered_with_an_error_status_is_passed_on_whole(stage: Stage) -> None:
    upstream = await stage.upstream()
    error = {"error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}}
    upstream.then(whole(error, status=400))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(stream=True).done()
    assert exchange.status == 400 and exchange.json() == error
    gw.assert_settled()


async def test_a_clients_request_id_is_echoed_when_it_is_short_and_printable_and_never_sent_upstream(
    stage: Stage,
) -> None:
    """The upstream always gets the gateway's own id (two clients' equal ids must not collide in vLLM)."""
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    taken = await gw.chat(headers={"x-request-id": "trace-42"}).done()
    assert taken.headers["x-request-id"] == "trace-42"
    refused = await gw.chat(headers={"x-request-id": "x" * 200}).done()
    assert refused.headers["x-request-id"] != "x" * 200
    first, second = (s.headers["x-request-id"] for s in upstream.posts())
    assert first != "trace-42" and len(first) == 32 and second == refused.headers["x-request-id"]


# --- refusals before the queue ---------------------------------------------------------------------------


async def test_a_request_without_a_known_key_is_a_401_and_never_reaches_the_upstream(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, api_keys=[KEY])
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic " + KEY}, {"x-api-key": "no"}):
        exchange = await gw.chat(headers=headers).done()
        assert exchange.status == 401, headers
        error = exchange.error()
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
        assert exchange.headers["x-sweetspot-reason"] == "unauthorized"
    assert upstream.posts() == []
    assert gw.metric("sweetspot_rejections_total", reason="unauthorized") == 4
    gw.assert_settled()


async def test_a_known_key_passes_and_never_goes_upstream(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, api_keys=[KEY])
    assert (await gw.chat(headers={"authorization": f"Bearer {KEY}"}).done()).status == 200
    assert (await gw.chat(headers={"x-api-key": KEY}).done()).status == 200
    for seen in upstream.posts():
        assert "authorization" not in seen.headers and "x-api-key" not in seen.headers


async def test_without_keys_of_its_own_the_gateway_passes_the_clients_credential_on(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    await gw.chat(headers={"authorization": "Bearer theirs", "x-api-key": "k2"}).done()
    (seen,) = upstream.posts()
    assert seen.headers["authorization"] == "Bearer theirs" and seen.headers["x-api-key"] == "k2"


async def test_an_upstream_key_replaces_the_clients(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, upstream_api_key="upstream-secret")
    await gw.chat(headers={"authorization": "Bearer theirs"}).done()
    (seen,) = upstream.posts()
    assert seen.headers["authorization"] == "Bearer upstream-secret"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_declared_json_is_a_415(stage: Stage, content_type: str | None) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    body = json.dumps({"model": MODEL, "messages": CHAT}).encode()
    exchange = await gw.call("POST", "/v1/chat/completions", body=body, content_type=content_type)
    assert exchange.status == 415 and exchange.error()["code"] == "unsupported_media_type"
    assert upstream.posts() == []


async def test_a_body_over_the_limit_is_a_413_whether_declared_or_sent(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, max_body_bytes=200)
    big = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 300}]}).encode()
    declared = await gw.call("POST", "/v1/chat/completions", body=big)
    assert declared.status == 413 and declared.error()["code"] == "body_too_large"
    sent = gw.request("POST", "/v1/chat/completions", body=big, hold_body=True)  # no content-length
    sent.send_body(big[:150], more=True)
    sent.send_body(big[150:], more=True)
    await sent.done()
    assert sent.status == 413
    assert upstream.posts() == []
    assert gw.metric("sweetspot_rejections_total", reason="body_too_large") == 2


async def test_a_body_sent_in_pieces_is_put_together(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    body = json.dumps({"model": MODEL, "messages": CHAT}).encode()
    exchange = gw.request("POST", "/v1/chat/completions", body=body, hold_body=True)
    for at in range(0, len(body), 10):
        exchange.send_body(body[at : at + 10], more=True)
    exchange.send_body(b"")
    await exchange.done()
    assert exchange.status == 200
    assert upstream.posts()[0].body == body


async def test_bodies_still_arriving_count_against_the_byte_budget(stage: Stage) -> None:
    """max_queued_bytes holds the bodies being received as well as the waiting ones: many connections sending
    large bodies at once cannot hold more than it. Past it, a 429 with Retry-After that closes the
    connection; a body that finishes gives its bytes back, whatever its ending."""
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, max_queued_bytes=1000)
    queue = gw.parts.queue
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 500}]}).encode()
    first = gw.request("POST", "/v1/chat/completions", body=body, hold_body=True)
    first.send_body(body[:300], more=True)
    second = gw.request("POST", "/v1/chat/completions", body=body, hold_body=True)
    second.send_body(body[:300], more=True)
    await until(lambda: queue.receiving_bytes == 600)
    second.send_body(body[300:], more=True)  # its rest fits (860 of the 1,000 bytes held); 500 more do not
    second.send_body(b"x" * 500, more=True)
    await second.done()
    assert second.status == 429 and second.error()["code"] == "queue_bytes_full"
    assert int(second.headers["retry-after"]) >= 1 and second.headers["connection"] == "close"
    assert queue.receiving_bytes == 300  # the first's, still arriving
    first.send_body(body[300:])
    await first.done()
    assert first.status == 200 and upstream.posts()[0].body == body
    assert queue.receiving_bytes == 0
    small = await gw.chat().done()  # a body in one message is whole at once: it holds nothing while read
    assert small.status == 200
    gw.assert_settled()


async def test_a_large_declared_body_is_held_whole_before_it_is_read(stage: Stage) -> None:
    """A body that declares a large length is held in the byte budget whole as soon as its head arrives: one
    that cannot fit is refused at once (429, nothing of it read), never halfway through its upload."""
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, max_queued_bytes=150_000)
    queue = gw.parts.queue
    big = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 100_000}]}).encode()
    length = {"content-length": str(len(big))}
    first = gw.request("POST", "/v1/chat/completions", body=big, hold_body=True, headers=length)
    first.send_body(big[:1000], more=True)
    await until(lambda: queue.receiving_bytes == len(big))
    second = await gw.request("POST", "/v1/chat/completions", body=big, hold_body=True, headers=length).done()
    assert second.status == 429 and second.error()["code"] == "queue_bytes_full"
    assert "retry-after" in second.headers
    first.send_body(big[1000:])
    await first.done()
    assert first.status == 200 and queue.receiving_bytes == 0
    gw.assert_settled()


async def test_a_body_that_does_not_come_in_time_is_a_408_and_the_connection_closes(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, request_read_timeout_s=0.05)
    exchange = gw.request("POST", "/v1/chat/completions", body=b'{"model": "m"', hold_body=True)
    exchange.send_body(b'{"model": ', more=True)  # and nothing more
    await exchange.done()
    assert exchange.status == 408 and exchange.error()["code"] == "request_timeout"
    assert exchange.headers["connection"] == "close"
    assert upstream.posts() == []


async def test_a_client_that_leaves_while_sending_its_body_costs_nothing(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    exchange = gw.request("POST", "/v1/chat/completions", body=b"{}", hold_body=True)
    exchange.send_body(b'{"model": "m", ', more=True)
    exchange.hang_up()
    await exchange.done()
    assert upstream.posts() == []
    assert gw.metric("sweetspot_rejections_total", reason="client_disconnected") == 1
    assert gw.metric("sweetspot_requests_total", route="/v1/chat/completions", status="499", model="") == 1
    gw.assert_settled()


@pytest.mark.parametrize(
    ("body", "code", "param", "message"),
    [
        (b"", "invalid_json", None, "empty"),
        (b"{not json", "invalid_json", None, "not valid JSON"),
        (b"[1, 2]", "invalid_json", None, "JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "invalid_request", "model", "model"),
        (b'{"model": "m", "messages": []}', "invalid_request", "messages", "messages"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "invalid_request", "stream", "stream"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": -1}', "invalid_request", "max_tokens", ""),
        (b'{"model": "m", "messages": [{"role": "user"}], "n": 17}', "invalid_request", "n", "at most 16"),
    ],
)
async def test_bad_bodies_get_a_400_in_openais_shape_naming_the_problem(
    stage: Stage, body: bytes, code: str, param: str | None, message: str
) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    exchange = await gw.call("POST", "/v1/chat/completions", body=body)
    assert exchange.status == 400
    error = exchange.error()
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    assert message in error["message"]
    assert exchange.headers["x-sweetspot-reason"] == "bad_request"
    assert upstream.posts() == []
    assert gw.metric("sweetspot_rejections_total", reason="bad_request") == 1


async def test_a_model_no_upstream_serves_is_a_404_naming_the_param(stage: Stage) -> None:
    upstream = await stage.upstream(models=["served"])
    gw = await stage.gateway(upstream)
    exchange = await gw.chat().done()  # asks for "m"
    assert exchange.status == 404
    error = exchange.error()
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert upstream.posts() == []
    # the label stays bounded: an unknown model is not a label value
    assert gw.metric("sweetspot_requests_total", route="/v1/chat/completions", status="404", model="") == 1


async def test_an_upstream_without_a_model_list_serves_any_model(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.models = None  # its /v1/models answers 404: never refuse on missing information
    gw = await stage.gateway(upstream)
    exchange = await gw.request(
        "POST", "/v1/chat/completions", json_body={"model": "anything", "messages": CHAT}
    ).done()
    assert exchange.status == 200


async def test_a_priority_the_tenants_do_not_define_is_a_400(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    exchange = await gw.chat(headers={"x-sweetspot-priority": "urgent"}).done()
    assert exchange.status == 400 and exchange.error()["param"] == "x-sweetspot-priority"
    ok = await gw.chat(headers={"x-sweetspot-priority": "batch"}).done()
    assert ok.status == 200
    assert gw.metric("sweetspot_queue_wait_seconds_count", outcome="admitted", priority="batch") == 1


# --- the limit counts sequences ------------------------------------------------------------------------


async def test_a_request_holds_one_slot_per_sequence_it_runs(stage: Stage) -> None:
    """``n`` answers to each of ``k`` prompts are ``n x k`` sequences in the backend's batch: as many slots."""
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, initial_limit=4)
    wide = gw.request("POST", "/v1/completions", json_body={"model": MODEL, "prompt": ["a", "b"], "n": 2})
    await upstream.received_count(1)
    assert gw.inflight() == 4
    narrow = gw.chat()
    await until(lambda: gw.parts.queue.depth == 1)  # no slot left for even one more sequence
    gate.open()
    assert (await wide.done()).status == 200 and (await narrow.done()).status == 200
    gw.assert_settled()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "messages": CHAT, "n": 5}, "n"),
        ({"model": MODEL, "prompt": ["a", "b", "c", "d", "e"]}, "prompt"),
    ],
)
async def test_a_request_wider_than_any_limit_could_be_is_a_400_at_once(stage: Stage, body: dict, param: str) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, initial_limit=4)
    route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    exchange = await gw.call("POST", route, json_body=body)
    assert exchange.status == 400
    error = exchange.error()
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert "5 sequences" in error["message"] and "at most 4" in error["message"]
    assert exchange.headers["x-sweetspot-reason"] == "too_many_sequences"
    assert upstream.posts() == []


@pytest.mark.parametrize("declared", [True, False])
async def test_a_whole_answer_over_the_bound_is_a_502_and_is_not_read_further(stage: Stage, declared: bool) -> None:
    upstream = await stage.upstream()
    big = b'{"id": "x", "text": "' + b"y" * 400 + b'"}'
    upstream.then(raw(200, big, content_type="application/json") if declared else stream(big[:200], big[200:]))
    gw = await stage.gateway(upstream, max_response_bytes=256)
    exchange = await gw.chat().done()
    assert exchange.status == 502
    error = exchange.error()
    assert error["code"] == "response_too_large" and "stream it" in error["message"]
    assert gw.outcomes(upstream) == {"ok": 1}  # the upstream did its job: not a congestion signal
    gw.assert_settled()


# --- the same routes served by FastAPI, and the last-resort answer ---------------------------------------


async def test_the_routes_behave_the_same_behind_fastapi_alone(stage: Stage) -> None:
    """``create_app`` without the fast path in front still serves the generation routes (its OpenAPI routes)."""
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, app_factory=create_app)
    exchange = await gw.chat().done()
    assert exchange.status == 200 and exchange.json() == chat_answer()
    bad = await gw.call("POST", "/v1/chat/completions", body=b"{}")
    assert bad.status == 400 and bad.error()["param"] == "model"
    gw.assert_settled()


async def test_an_unforeseen_failure_is_a_500_in_openais_shape_and_the_permit_comes_back(
    stage: Stage, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A fault injected into the upstream client (a bug nobody foresaw) still answers in the client's shape."""
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(gw.parts.client, "send", broken)
    with caplog.at_level(logging.ERROR, "sweetspot.api"):
        exchange = await gw.chat().done()
    assert exchange.status == 500 and exchange.error()["code"] == "internal_error"
    assert "a bug" not in exchange.body.decode()
    assert any("failed unexpectedly" in r.getMessage() for r in caplog.records)
    assert gw.outcomes(upstream) == {"upstream_error": 1}
    gw.assert_settled()


async def test_the_access_log_has_one_line_per_request_with_its_measurements(
    stage: Stage, caplog: pytest.LogCaptureFixture
) -> None:
    upstream = await stage.upstream()
    upstream.then(whole(chat_answer(prompt=4, completion=2)))
    gw = await stage.gateway(upstream)
    with caplog.at_level(logging.INFO, "sweetspot.access"):
        await gw.chat(headers={"x-request-id": "one"}).done()
        await gw.call("POST", "/v1/chat/completions", body=b"{}", headers={"x-request-id": "two"})
    # The client's X-Request-Id is logged beside the gateway's own (which is what went upstream).
    lines = {r.client_request_id: r for r in caplog.records if r.name == "sweetspot.access"}  # type: ignore[attr-defined]
    assert set(lines) == {"one", "two"}
    assert all(len(r.request_id) == 32 for r in lines.values())  # type: ignore[attr-defined]
    one, two = lines["one"], lines["two"]
    assert (one.status, one.outcome, one.upstream, one.model) == (200, "ok", upstream.url, MODEL)  # type: ignore[attr-defined]
    assert (one.prompt_tokens, one.output_tokens, one.reason) == (4, 2, None)  # type: ignore[attr-defined]
    assert (two.status, two.reason, two.upstream) == (400, "bad_request", None)  # type: ignore[attr-defined]


async def test_a_request_is_forwarded_without_asking_its_body_for_fields_its_api_lacks(
    stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic answers a name its model lacks in ``__getattr__``, formatting and raising an ``AttributeError``
    (microseconds, per request): the path reads bodies with ``field_of`` (``tests/unit/test_body_fields.py``)."""

    def refuse(self: object, name: str) -> None:
        raise AssertionError(f"{type(self).__name__}.{name} was read through pydantic's __getattr__")

    for route in ROUTES:
        monkeypatch.setattr(route.schema, "__getattr__", refuse)
    first, second = await stage.upstream(), await stage.upstream()
    gw = await stage.gateway(first, second, routing="prefix")  # the router reads the prompt too
    chat = await gw.call("POST", "/v1/chat/completions", json_body={"model": MODEL, "messages": CHAT, "n": 1})
    completion = await gw.call("POST", "/v1/completions", json_body={"model": MODEL, "prompt": ["a", "b"]})
    assert (chat.status, completion.status) == (200, 200)
