"""What takes no permit: the light routes (``routes/light.py``: tokenize, count tokens, stored responses, the
operator's pass-through paths), the operator's routes (``routes/ops.py``), the model list, and what an unknown
route or a wrong method is told (``app.py``).
"""

from __future__ import annotations

import logging

import pytest

from gateway.server.app import create_app
from gateway.server.routes.proxied import ProxiedRoutes
from gateway.settings import Settings, TenantConfig
from tests.component.conftest import (
    MODEL,
    Gate,
    Stage,
    drop,
    hang,
    refused_url,
    until,
    whole,
)


async def test_tokenize_goes_to_an_upstream_serving_the_model_without_taking_a_permit(stage: Stage) -> None:
    other, serving = await stage.upstream(models=["other"]), await stage.upstream()
    gate = Gate()
    serving.then(hang(gate))
    gw = await stage.gateway(other, serving, initial_limit=1)
    holder = gw.chat()  # holds the serving upstream's only permit
    await serving.received_count(1)
    serving.then(whole({"tokens": [1, 2, 3]}))
    answer = await gw.call(
        "POST", "/tokenize?add_special=true", json_body={"model": MODEL, "prompt": "x"}, headers={"x-request-id": "t1"}
    )
    assert answer.status == 200 and answer.json() == {"tokens": [1, 2, 3]}
    seen = serving.received[-1]
    assert (seen.path, seen.query, seen.headers["x-request-id"]) == ("/tokenize", "add_special=true", "t1")
    assert other.received == []
    assert gw.inflight() == 1  # only the chat request's
    gate.open()
    await holder.done()
    gw.assert_settled()


async def test_detokenize_without_a_model_goes_to_any_healthy_upstream(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(whole({"prompt": "hi"}))
    gw = await stage.gateway(upstream)
    answer = await gw.call("POST", "/detokenize", json_body={"tokens": [1]})
    assert answer.status == 200 and answer.json() == {"prompt": "hi"}
    assert "x-request-id" not in upstream.received[-1].headers  # none given, none made up
    empty = await gw.call("POST", "/detokenize", body=b"")
    assert empty.status == 200


async def test_light_routes_refuse_what_they_cannot_place(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, max_body_bytes=64)
    bad = await gw.call("POST", "/tokenize", body=b"{nope")
    assert bad.status == 400 and bad.error()["code"] == "invalid_json"
    big = await gw.call("POST", "/tokenize", json_body={"model": MODEL, "prompt": "x" * 100})
    assert big.status == 413 and big.error()["type"] == "invalid_request_error"
    assert upstream.received == []


async def test_a_light_request_whose_model_is_served_only_by_an_upstream_that_is_down_is_a_503(stage: Stage) -> None:
    up, down = await stage.upstream(), await stage.upstream(models=["elsewhere"])
    down.health = 503
    gw = await stage.gateway(up, down)
    answer = await gw.call("POST", "/tokenize", json_body={"model": "elsewhere"})
    assert answer.status == 503 and answer.headers["retry-after"] == "2"
    assert answer.error()["code"] == "no_upstream"
    assert up.received == [] and down.received == []


@pytest.mark.parametrize("path", ["/tokenize", "/v1/messages/count_tokens"])
async def test_a_light_request_for_a_model_no_upstream_serves_is_a_404_as_on_the_generation_routes(
    stage: Stage, path: str
) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    generation = await gw.call("POST", "/v1/chat/completions", json_body={"model": "nobody", "messages": [{}]})
    assert generation.status == 404  # the generation routes' answer to the same mistake
    answer = await gw.call("POST", path, json_body={"model": "nobody", "messages": [{}]})
    assert upstream.received == []
    assert answer.status == 404, (answer.status, answer.headers.get("retry-after"))
    assert "retry-after" not in answer.headers  # nothing to wait for: a retry cannot succeed


async def test_a_light_request_to_an_upstream_that_is_gone_is_a_502_and_takes_it_out(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    await upstream.close()
    answer = await gw.call("POST", "/tokenize", json_body={"model": MODEL, "prompt": "x"})
    assert answer.status == 502 and answer.error()["code"] == "upstream_unavailable"
    assert upstream.url not in answer.error()["message"]
    assert not gw.upstream(upstream).healthy


async def test_a_light_request_dropped_by_the_upstream_is_a_502_but_leaves_it_in(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(drop())
    gw = await stage.gateway(upstream)
    answer = await gw.call("POST", "/tokenize", json_body={"model": MODEL})
    assert answer.status == 502
    assert gw.upstream(upstream).healthy


async def test_light_routes_need_a_key_when_keys_are_set_and_keep_it_from_the_upstream(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.default = whole({"ok": True})
    gw = await stage.gateway(upstream, api_keys=["k"], tenants=[TenantConfig(name="t", api_keys=["tk"])])
    denied = await gw.call("POST", "/tokenize", json_body={"model": MODEL})
    assert denied.status == 401 and denied.error()["code"] == "invalid_api_key"
    anthropic = await gw.call("POST", "/v1/messages/count_tokens", json_body={"model": MODEL})
    assert anthropic.status == 401
    assert anthropic.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid or missing API key"},
    }
    for headers in ({"authorization": "Bearer k"}, {"x-api-key": "tk"}):
        answer = await gw.call("POST", "/v1/messages/count_tokens", json_body={"model": MODEL}, headers=headers)
        assert answer.status == 200, headers
        assert "authorization" not in upstream.received[-1].headers
        assert "x-api-key" not in upstream.received[-1].headers
    assert gw.metric("sweetspot_rejections_total", reason="unauthorized") == 2


async def test_a_stored_response_the_gateway_does_not_know_is_asked_of_each_upstream(stage: Stage) -> None:
    first, second = await stage.upstream(), await stage.upstream()
    missing = whole({"error": {"message": "not found"}}, status=404)
    first.default = missing
    second.then(whole({"id": "resp_9", "status": "completed"}))
    gw = await stage.gateway(first, second)
    found = await gw.call("GET", "/v1/responses/resp_9")
    assert found.status == 200 and found.json()["id"] == "resp_9"
    assert [s.path for s in first.received] == [s.path for s in second.received] == ["/v1/responses/resp_9"]
    # remembered now: the next one goes straight to its owner
    second.then(whole({"id": "resp_9", "status": "cancelled"}))
    cancelled = await gw.call("POST", "/v1/responses/resp_9/cancel")
    assert cancelled.json()["status"] == "cancelled" and len(first.received) == 1
    second.then(whole({"id": "resp_9", "deleted": True}))
    deleted = await gw.call("DELETE", "/v1/responses/resp_9")
    assert deleted.json()["deleted"] is True and second.received[-1].method == "DELETE"


async def test_a_stored_response_no_upstream_has_is_the_backends_404(stage: Stage) -> None:
    first, second = await stage.upstream(), await stage.upstream()
    for fake in (first, second):
        fake.default = whole({"error": {"message": "Response not found"}}, status=404)
    gw = await stage.gateway(first, second)
    answer = await gw.call("GET", "/v1/responses/resp_nowhere")
    assert answer.status == 404 and answer.json() == {"error": {"message": "Response not found"}}
    assert len(first.received) == len(second.received) == 1


async def test_a_stored_response_with_no_healthy_upstream_to_ask_is_the_gateways_404(stage: Stage) -> None:
    url, sock = refused_url()
    try:
        gw = await stage.gateway(url)
        answer = await gw.call("GET", "/v1/responses/resp_1")
        assert answer.status == 404
        error = answer.error()
        assert (error["code"], error["param"]) == ("response_not_found", "response_id")
    finally:
        sock.close()


async def test_only_the_listed_passthrough_paths_reach_the_backend(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.default = whole({"text": "transcribed"})
    gw = await stage.gateway(upstream, passthrough_paths=["/v1/audio/transcriptions", "/version"])
    posted = await gw.call("POST", "/v1/audio/transcriptions", body=b'{"file": "x"}')
    assert posted.status == 200 and posted.json() == {"text": "transcribed"}
    got = await gw.call("GET", "/version")
    assert got.status == 200 and upstream.received[-1].method == "GET" and upstream.received[-1].body == b""
    closed = await gw.call("GET", "/slots")
    assert closed.status == 404
    error = closed.error()
    assert error["code"] == "unknown_route" and "GET /slots" in error["message"]
    assert [s.path for s in upstream.received] == ["/v1/audio/transcriptions", "/version"]


async def test_a_passthrough_path_with_no_healthy_upstream_is_a_503(stage: Stage) -> None:
    url, sock = refused_url()
    try:
        gw = await stage.gateway(url, passthrough_paths=["/version"])
        answer = await gw.call("GET", "/version")
        assert answer.status == 503 and answer.headers["retry-after"] == "2"
    finally:
        sock.close()


# --- ops routes, the model list, unknown routes ----------------------------------------------------------


async def test_liveness_and_readiness_do_not_depend_on_the_upstreams(stage: Stage) -> None:
    url, sock = refused_url()
    try:
        gw = await stage.gateway(url)
        alive = await gw.call("GET", "/healthz")
        assert alive.status == 200 and alive.json() == {"status": "ok"}
        ready = await gw.call("GET", "/readyz")
        assert ready.status == 200
        body = ready.json()
        assert body["ready"] is True and body["any_upstream_healthy"] is False
        assert body["upstreams"]["upstream-1"]["healthy"] is False
        assert "/health failed" in body["upstreams"]["upstream-1"]["error"]
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("models", "healthy", "error"),
    [([MODEL], True, None), (None, False, "/v1/models answered 404")],
)
async def test_an_upstream_without_a_health_route_is_judged_by_its_model_list(
    stage: Stage, models: list[str] | None, healthy: bool, error: str | None
) -> None:
    upstream = await stage.upstream(models=models)
    upstream.models = models
    upstream.health = 404  # a plain OpenAI server: no /health
    gw = await stage.gateway(upstream)
    state = (await gw.call("GET", "/readyz")).json()["upstreams"]["upstream-1"]
    assert state == {"healthy": healthy, "error": error}


async def test_a_periodic_loop_that_fails_is_logged_and_the_gateway_serves_on(
    stage: Stage, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a poller never takes the request path down: here the GPU reading raises on every tick."""

    class BrokenGpus:
        reason = None

        def read(self) -> list:
            raise RuntimeError("driver wedged")

        def close(self) -> None:
            pass

    def app_with_broken_gpus(settings: Settings) -> ProxiedRoutes:
        app = create_app(settings, gpu_source=BrokenGpus())
        return ProxiedRoutes(app, app.state.gateway)  # as create_server_app composes it

    upstream = await stage.upstream()
    with caplog.at_level(logging.ERROR, "sweetspot.loops"):
        gw = await stage.gateway(upstream, app_factory=app_with_broken_gpus)
        await until(lambda: any("NVML read failed" in r.getMessage() for r in caplog.records))
    assert (await gw.chat().done()).status == 200


async def test_the_map_of_stored_responses_is_bounded(stage: Stage) -> None:
    """Past ``response_affinity_max`` the oldest id is forgotten: it is then asked of every upstream in turn."""
    first, second = await stage.upstream(), await stage.upstream(models=[MODEL, "second-only"])
    second.then(whole({"id": "resp_a"}), whole({"id": "resp_b"}))
    gw = await stage.gateway(first, second, response_affinity_max=1)
    for _ in range(2):
        body = {"model": "second-only", "input": "x"}
        assert (await gw.call("POST", "/v1/responses", json_body=body)).status == 200
    first.default = whole({"error": {"message": "Response not found"}}, status=404)
    second.default = whole({"id": "found"})
    await gw.call("GET", "/v1/responses/resp_b")  # remembered: straight to its owner
    assert first.received == []
    await gw.call("GET", "/v1/responses/resp_a")  # forgotten: the first upstream is asked too
    assert [s.path for s in first.received] == ["/v1/responses/resp_a"]


async def test_metrics_are_the_apps_own_registry_in_prometheus_text(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    await gw.chat().done()
    page = await gw.call("GET", "/metrics")
    assert page.status == 200 and page.headers["content-type"].startswith("text/plain")
    text = page.body.decode()
    assert f'sweetspot_inflight{{upstream="{upstream.url}"}} 0.0' in text
    assert f'sweetspot_limit{{upstream="{upstream.url}"}} 4.0' in text
    assert f'sweetspot_upstream_healthy{{upstream="{upstream.url}"}} 1.0' in text
    assert 'sweetspot_requests_total{model="m",route="/v1/chat/completions",status="200"} 1.0' in text
    assert "sweetspot_queue_depth 0.0" in text and "sweetspot_queue_capacity 1024.0" in text
    assert 'sweetspot_tenant_inflight{tenant="default"} 0.0' in text


async def test_metrics_and_state_need_the_admin_key_when_one_is_set(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, admin_api_key="admin", api_keys=["client"])
    for path in ("/metrics", "/state"):
        for headers in ({}, {"authorization": "Bearer client"}):
            denied = await gw.call("GET", path, headers=headers)
            assert denied.status == 401 and denied.error()["code"] == "invalid_api_key", (path, headers)
        assert (await gw.call("GET", path, headers={"authorization": "Bearer admin"})).status == 200
    assert (await gw.call("GET", "/healthz")).status == 200  # the probes stay open


async def test_state_shows_the_queue_the_upstreams_and_the_tenants(stage: Stage) -> None:
    upstream = await stage.upstream()
    tenants = [
        TenantConfig(name="quota", output_tokens_per_minute=100, max_queued=3),
        TenantConfig(name="plain"),
    ]
    gw = await stage.gateway(upstream, tenants=tenants, tenant_header="x-tenant")
    await gw.chat(headers={"x-tenant": "quota"}).done()
    await gw.chat(headers={"x-tenant": "passer-by"}).done()
    state = (await gw.call("GET", "/state")).json()
    queue = state["queue"]
    assert (queue["depth"], queue["max_queue"]) == (0, 1024)
    assert queue["by_class"] == {"interactive": 0, "standard": 0, "batch": 0}
    assert queue["drain_rate_per_s"] > 0 and queue["retry_after_s"] >= 1  # two releases just now
    assert state["routing"] == {"policy": "least_loaded"}
    (entry,) = state["upstreams"]
    assert (entry["url"], entry["healthy"], entry["models"], entry["limit"], entry["inflight"]) == (
        upstream.url,
        True,
        [MODEL],
        4,
        0,
    )
    assert (entry["window"]["completed"], entry["window"]["ok"], entry["window"]["output_tokens"]) == (2, 2, 2)
    assert "controller" not in entry  # no controller: a static limit
    assert entry["backend"]["kind"] == "openai"  # no metrics of a known server: a plain OpenAI server
    quota = state["tenants"]["quota"]
    assert quota["max_queued"] == 3 and quota["quota"]["output_tokens_per_minute"] == 100
    assert quota["quota"]["left"] == 99  # the chat answer's one output token
    assert state["tenants"]["plain"]["quota"] is None
    assert state["tenants"]["other"] == {"tenants": 1, "queued": 0, "inflight": 0}
    assert isinstance(state["process"], int)


async def test_state_shows_each_controller_and_the_prefix_map(stage: Stage) -> None:
    first, second = await stage.upstream(), await stage.upstream()
    gw = await stage.gateway(first, second, control_enabled=True, control_interval_s=3600, routing="prefix")
    await gw.chat().done()
    state = (await gw.call("GET", "/state")).json()
    assert state["routing"]["policy"] == "prefix" and state["routing"]["prefix_map_max"] == 200_000
    assert all("controller" in entry for entry in state["upstreams"])


async def test_the_model_list_is_the_union_of_the_upstreams_and_needs_a_key(stage: Stage) -> None:
    first, second = await stage.upstream(models=["a", "b"]), await stage.upstream(models=["b", "c"])
    gw = await stage.gateway(first, second, api_keys=["k"])
    assert (await gw.call("GET", "/v1/models")).status == 401
    listed = await gw.call("GET", "/v1/models", headers={"authorization": "Bearer k"})
    assert listed.json() == {
        "object": "list",
        "data": [{"id": m, "object": "model"} for m in ("a", "b", "c")],
    }


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/v1/chat/completions", 405), ("GET", "/nope", 404)])
async def test_unknown_routes_and_wrong_methods_answer_in_openais_shape(
    stage: Stage, method: str, path: str, status: int
) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    answer = await gw.call(method, path)
    assert answer.status == status
    assert answer.error()["type"] == "invalid_request_error"
    assert upstream.received == []


async def test_a_light_body_sent_too_slowly_is_a_408_and_one_abandoned_costs_nothing(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, request_read_timeout_s=0.05)
    slow = gw.request("POST", "/tokenize", body=b"{}", hold_body=True)
    slow.send_body(b'{"model": ', more=True)
    await slow.done()
    assert slow.status == 408 and slow.headers["connection"] == "close"
    assert slow.error()["code"] == "request_timeout"
    gone = gw.request("POST", "/tokenize", body=b"{}", hold_body=True)
    gone.send_body(b'{"model": ', more=True)
    gone.hang_up()
    await gone.done()
    assert upstream.received == []
    assert gw.metric("sweetspot_rejections_total", reason="client_disconnected") == 1


async def test_stored_responses_and_passthrough_paths_need_a_key_too(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, api_keys=["k"], passthrough_paths=["/version"])
    for method, path in (("GET", "/v1/responses/resp_1"), ("DELETE", "/v1/responses/resp_1"), ("GET", "/version")):
        denied = await gw.call(method, path)
        assert denied.status == 401, path
    assert upstream.received == []


async def test_an_unforeseen_failure_on_a_light_route_is_a_500_in_openais_shape(
    stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault injected into the upstream client: the app's last handler answers, and the server sees the error."""
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(gw.parts.client, "forward", broken)
    exchange = gw.request("POST", "/tokenize", json_body={"model": MODEL})
    with pytest.raises(RuntimeError, match="a bug"):
        await exchange.done()  # Starlette re-raises it to the server, after the answer went out
    assert exchange.status == 500
    assert exchange.error()["code"] == "internal_error" and "a bug" not in exchange.body.decode()
