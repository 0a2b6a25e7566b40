"""Model names as clients use them (docs/gateway.md, "Model names: aliases, a default, any-name upstreams"): an
alias's served name goes upstream and labels the metrics, the default model takes names no upstream lists, an
upstream that answers any name (llama-server) serves them without a default, and anything else is a 404 in the
route's own dialect. ``/v1/models`` lists the aliases."""

from __future__ import annotations

import json
import logging
from typing import Any

import anthropic
import openai
import pytest

from tests.component.conftest import CHAT, MODEL, Stage, chat_answer, stream, token, until, usage, whole
from tests.component.test_named_events import MESSAGES, anthropic_error, message_events, messages_body
from tests.component.test_served import served

ALIAS = "gpt-4o-mini"


def access_lines(caplog: pytest.LogCaptureFixture) -> list[Any]:
    return [r for r in caplog.records if r.name == "sweetspot.access"]


async def test_an_alias_sends_the_served_name_upstream_and_labels_it_so(
    stage: Stage, caplog: pytest.LogCaptureFixture
) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, model_aliases={ALIAS: MODEL})
    with caplog.at_level(logging.INFO, "sweetspot.access"):
        answer = await gw.chat(model=ALIAS, temperature=0.5, user="ü", top_k=5).done()
    assert answer.status == 200 and answer.json()["model"] == MODEL  # the upstream's own answer: the served name
    sent = upstream.posts("/v1/chat/completions")[0].json
    assert sent == {
        "model": MODEL,
        "messages": CHAT,
        "temperature": 0.5,
        "user": "ü",
        "top_k": 5,
    }  # nothing else changed
    assert gw.metric("sweetspot_upstream_requests_total", upstream=upstream.url, outcome="ok", model=MODEL) == 1
    assert gw.metric("sweetspot_requests_total", route="/v1/chat/completions", status="200", model=MODEL) == 1
    (line,) = access_lines(caplog)
    assert (line.model, line.client_model) == (MODEL, ALIAS)
    gw.assert_settled()


async def test_an_aliased_stream_asks_for_usage_and_names_the_served_model(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(token("Hi"), usage(3, 1), b"data: [DONE]\n\n"))
    gw = await stage.gateway(upstream, model_aliases={"short": ALIAS, ALIAS: MODEL})  # an alias of an alias
    answer = await gw.chat(model="short", stream=True).done()
    assert answer.status == 200
    sent = upstream.posts()[0].json
    assert sent["model"] == MODEL and sent["stream_options"] == {"include_usage": True}
    assert gw.metric("sweetspot_output_tokens_total", upstream=upstream.url, model=MODEL) == 1
    gw.assert_settled()


async def test_a_name_no_upstream_lists_goes_to_the_default_model(stage: Stage) -> None:
    first = await stage.upstream()
    second = await stage.upstream(models=["other-model"])
    gw = await stage.gateway(first, second, default_model=MODEL)
    assert (await gw.chat(model="whatever").done()).status == 200
    assert first.posts()[0].json["model"] == MODEL
    # A name an upstream lists is its own, default or not.
    assert (await gw.chat(model="other-model").done()).status == 200
    assert second.posts()[0].json["model"] == "other-model"
    assert gw.metric("sweetspot_upstream_requests_total", upstream=first.url, outcome="ok", model=MODEL) == 1


async def test_an_upstream_that_answers_any_name_serves_names_nobody_lists(
    stage: Stage, caplog: pytest.LogCaptureFixture
) -> None:
    vllm = await stage.upstream(models=["qwen3-8b"])
    llama = await stage.upstream(models=["model.gguf"])
    llama.props = {"total_slots": 4}  # what the backend scrape detects llama-server by
    gw = await stage.gateway(vllm, llama)
    await until(lambda: gw.upstream(llama).any_name)
    assert not gw.upstream(vllm).any_name
    with caplog.at_level(logging.INFO, "sweetspot.access"):
        answer = await gw.chat(model=ALIAS).done()
    assert answer.status == 200 and not vllm.posts()
    assert llama.posts()[0].json["model"] == ALIAS  # as the client named it, as llama-server gets it direct
    # Labelled with what ran: the one model the llama-server serves (a client's names mint no series).
    assert gw.metric("sweetspot_upstream_requests_total", upstream=llama.url, outcome="ok", model="model.gguf") == 1
    (line,) = access_lines(caplog)
    assert (line.model, line.client_model) == (ALIAS, ALIAS)
    # A name the vLLM lists goes there.
    assert (await gw.chat(model="qwen3-8b").done()).status == 200 and len(vllm.posts()) == 1


async def test_a_llama_server_listing_several_models_picks_by_name(stage: Stage) -> None:
    llama = await stage.upstream(models=["a.gguf", "b.gguf"])  # router mode: the name matters
    llama.props = {"total_slots": 4}
    gw = await stage.gateway(llama)
    await until(lambda: gw.upstream(llama).any_name)
    assert (await gw.chat(model=ALIAS).done()).status == 404 and not llama.posts()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "nope", "messages": CHAT}),
        ("/v1/completions", {"model": "nope", "prompt": "hi"}),
        ("/v1/embeddings", {"model": "nope", "input": "hi"}),
        ("/v1/responses", {"model": "nope", "input": "hi"}),
    ],
)
async def test_an_unknown_name_is_a_404_in_openais_shape(stage: Stage, path: str, body: dict[str, Any]) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, model_aliases={ALIAS: MODEL})
    answer = await gw.call("POST", path, json_body=body)
    assert answer.status == 404
    assert answer.error()["code"] == "model_not_found" and "`nope`" in answer.error()["message"]
    assert not upstream.posts()


async def test_an_unknown_name_is_a_404_in_anthropics_shape_and_an_alias_is_served(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(stream(*message_events()))
    gw = await stage.gateway(upstream, model_aliases={"claude-sonnet-4-5": MODEL})
    missing = await gw.call("POST", MESSAGES, json_body=messages_body(model="claude-opus"))
    assert missing.status == 404 and anthropic_error(missing)["type"] == "not_found_error"
    found = await gw.call("POST", MESSAGES, json_body=messages_body(model="claude-sonnet-4-5", stream=True))
    assert found.status == 200 and upstream.posts()[0].json["model"] == MODEL


async def test_an_alias_whose_served_name_nobody_serves_is_a_404_naming_both(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, model_aliases={ALIAS: "not-loaded"})
    answer = await gw.chat(model=ALIAS).done()
    assert answer.status == 404 and "`gpt-4o-mini` (served as `not-loaded`)" in answer.error()["message"]


async def test_models_lists_the_aliases_of_served_names(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, model_aliases={ALIAS: MODEL, "later": "not-loaded"})
    listed = (await gw.call("GET", "/v1/models")).json()["data"]
    by_id = {entry["id"]: entry for entry in listed}
    assert set(by_id) == {MODEL, ALIAS}  # an alias of a name nobody serves now is not offered
    assert by_id[ALIAS]["owned_by"] == f"alias of {MODEL}" and by_id[ALIAS]["root"] == MODEL
    assert by_id[ALIAS]["object"] == "model"


async def test_a_light_route_sends_the_served_name(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(whole({"tokens": [1, 2]}))
    gw = await stage.gateway(upstream, model_aliases={ALIAS: MODEL})
    assert (await gw.call("POST", "/tokenize", json_body={"model": ALIAS, "prompt": "hi"})).status == 200
    assert upstream.posts("/tokenize")[0].json == {"model": MODEL, "prompt": "hi"}
    assert (await gw.call("POST", "/tokenize", json_body={"model": "nope", "prompt": "hi"})).status == 404


async def test_a_served_name_nobody_lists_at_start_is_a_warning(stage: Stage, caplog: pytest.LogCaptureFixture) -> None:
    upstream = await stage.upstream()
    with caplog.at_level(logging.WARNING, "sweetspot.upstreams"):
        await stage.gateway(upstream, model_aliases={ALIAS: "not-loaded"}, default_model=MODEL)
    warnings = [r.getMessage() for r in caplog.records if r.name == "sweetspot.upstreams"]
    assert warnings == [
        "model_aliases: 'gpt-4o-mini' names 'not-loaded', which no upstream lists now; requests for it get 404 "
        "until one does (a model loaded later, or an upstream that answers any name, such as llama-server)"
    ]


async def test_both_sdks_ask_for_an_alias_and_get_the_served_models_answer(stage: Stage) -> None:
    upstream = await stage.upstream()
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [{"type": "text", "text": "Hi!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    upstream.then(whole(chat_answer("hello")), whole(message))
    gw = await stage.gateway(upstream, model_aliases={ALIAS: MODEL, "claude-haiku-4-5": MODEL})
    async with served(gw) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10)
        completion = await client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hi"}])
        assert completion.model == MODEL and completion.choices[0].message.content == "hello"
        assert ALIAS in [model.id async for model in client.models.list()]
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
        await client.close()
        claude = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0, timeout=10)
        reply = await claude.messages.create(
            model="claude-haiku-4-5", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.model == MODEL and reply.content[0].text == "Hi!"  # type: ignore[union-attr]
        with pytest.raises(anthropic.NotFoundError):
            await claude.messages.create(model="nope", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
        await claude.close()
    assert [json.loads(s.body)["model"] for s in upstream.posts()] == [MODEL, MODEL]
    gw.assert_settled()
