"""Models that come and go (docs/gateway.md, "Model names"): an upstream's model list is read again on each health
poll, and at once when the upstream answers 404 "the model does not exist" to a request, so a model (a LoRA
adapter) loaded on one upstream is routable within a poll interval and one unloaded is no longer routed there. A
request such a 404 answered was not run: it fails over, once, to another upstream listing the model, else the
client gets the upstream's own 404."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.server.upstream.health import health_tick
from tests.component.conftest import MODEL, Stage, chat_answer, until, whole

ADAPTER = "sql-lora"
MODELS = "/v1/models"


def vllm_missing(model: str, *, old: bool = False) -> dict[str, Any]:
    """vLLM's 404 for a model it does not serve: under ``error`` since 0.10, at the top (``object: error``) before."""
    error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "param": None, "code": 404}
    return {"object": "error", **error} if old else {"error": error}


async def test_a_model_loaded_on_an_upstream_is_routable_after_the_next_poll(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, health_interval_s=0.05)
    refused = await gw.chat(model=ADAPTER).done()
    assert refused.status == 404 and refused.error()["code"] == "model_not_found"  # the gateway's own: not sent
    assert upstream.posts() == []

    upstream.models = [MODEL, ADAPTER]  # vLLM's /v1/load_lora_adapter
    await until(lambda: gw.parts.pool.listed(ADAPTER))

    assert (await gw.chat(model=ADAPTER).done()).status == 200
    assert [seen.json["model"] for seen in upstream.posts()] == [ADAPTER]
    assert any(entry["id"] == ADAPTER for entry in (await gw.call("GET", "/v1/models")).json()["data"])
    gw.assert_settled()


async def test_a_model_unloaded_from_one_upstream_is_no_longer_routed_there(stage: Stage) -> None:
    first = await stage.upstream(models=[MODEL, ADAPTER])
    second = await stage.upstream(models=[MODEL, ADAPTER])
    gw = await stage.gateway(first, second)
    first.models = [MODEL]  # unloaded there
    await health_tick(gw.parts)()  # the poll the lifespan runs every health_interval_s

    for _ in range(4):
        assert (await gw.chat(model=ADAPTER).done()).status == 200
    assert first.posts() == [] and len(second.posts()) == 4
    assert gw.parts.pool.resolve(ADAPTER).eligible == [second.url]
    second.models = [MODEL]  # unloaded everywhere: the gateway's own 404, and /v1/models no longer lists it
    await health_tick(gw.parts)()
    assert (await gw.chat(model=ADAPTER).done()).status == 404 and len(second.posts()) == 4
    assert ADAPTER not in {entry["id"] for entry in (await gw.call("GET", "/v1/models")).json()["data"]}
    gw.assert_settled()


@pytest.mark.parametrize("old", [False, True], ids=["error-object", "object-error"])
async def test_a_404_model_not_found_reads_the_model_list_at_once(stage: Stage, old: bool) -> None:
    upstream = await stage.upstream(models=[MODEL, ADAPTER])
    gw = await stage.gateway(upstream)  # the health poll does not run again during the test
    polled = upstream.polled[MODELS]
    upstream.models = [MODEL]  # unloaded since the gateway read the list
    upstream.then(whole(vllm_missing(ADAPTER, old=old), status=404))

    answer = await gw.chat(model=ADAPTER).done()

    assert answer.status == 404 and answer.json() == vllm_missing(ADAPTER, old=old)  # the upstream's own answer
    await upstream.wait(lambda: upstream.polled[MODELS] == polled + 1)
    await until(lambda: not gw.parts.pool.listed(ADAPTER))
    again = await gw.chat(model=ADAPTER).done()
    assert again.status == 404 and again.error()["code"] == "model_not_found"  # the gateway's own: not sent
    assert len(upstream.posts()) == 1
    assert gw.outcomes(upstream) == {"client_error": 1}
    assert (await gw.chat().done()).status == 200  # the base model is still served there
    gw.assert_settled()


async def test_404s_model_not_found_read_the_list_at_most_once_a_second(stage: Stage) -> None:
    """An upstream whose list names a model it then refuses (listed, not loaded yet): every request is a 404, and
    the list is read once, not once per request."""
    upstream = await stage.upstream(models=[MODEL, ADAPTER])
    upstream.default = whole(vllm_missing(ADAPTER), status=404)
    gw = await stage.gateway(upstream)
    polled = upstream.polled[MODELS]

    for _ in range(5):
        assert (await gw.chat(model=ADAPTER).done()).status == 404
    await until(lambda: gw.upstream(upstream).models_refresh is None)

    assert len(upstream.posts()) == 5 and upstream.polled[MODELS] == polled + 1
    gw.assert_settled()


async def test_a_404_model_not_found_fails_over_to_an_upstream_that_lists_the_model(stage: Stage) -> None:
    """The 404 proves the first upstream did not run the request: another that lists the model may, once."""
    stale = await stage.upstream(models=[MODEL, ADAPTER])
    loaded = await stage.upstream(models=[MODEL, ADAPTER])
    gw = await stage.gateway(stale, loaded)
    stale.models = [MODEL]
    stale.default = whole(vllm_missing(ADAPTER), status=404)

    answer = await gw.chat(model=ADAPTER).done()

    assert answer.status == 200 and answer.json() == chat_answer()
    assert len(stale.posts()) == 1 and len(loaded.posts()) == 1  # least-loaded ties go to the first upstream
    assert gw.metric("sweetspot_upstream_retries_total", upstream=stale.url, reason="failover") == 1
    assert gw.outcomes(stale) == {"client_error": 1} and gw.outcomes(loaded) == {"ok": 1}  # no upstream failure
    await until(lambda: gw.parts.pool.resolve(ADAPTER).eligible == [loaded.url])
    assert (await gw.chat(model=ADAPTER).done()).status == 200 and len(stale.posts()) == 1
    gw.assert_settled()


async def test_a_404_about_anything_else_is_passed_on_and_reads_no_list(stage: Stage) -> None:
    upstream = await stage.upstream()
    missing = {"error": {"message": "Response with id 'resp_1' not found.", "type": "NotFoundError", "code": 404}}
    upstream.then(whole(missing, status=404))
    gw = await stage.gateway(upstream)
    polled = upstream.polled[MODELS]

    answer = await gw.chat().done()

    assert answer.status == 404 and answer.json() == missing
    assert gw.upstream(upstream).models_refresh is None and upstream.polled[MODELS] == polled
    gw.assert_settled()
