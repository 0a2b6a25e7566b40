"""Fuzzing the proxied routes with schemathesis, from the gateway's own OpenAPI document, against a real
gateway process in front of the simulator: valid and invalid bodies alike must get no 5xx from the gateway,
every error must be OpenAI-shaped, and no permit may stay taken."""

from __future__ import annotations

import json
import zlib

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from testbed.gateway import get_json, start_gateway, start_sim

EXAMPLES = 25  # per route and mode: bounded, so the module stays around a minute on 2 busy cores


@pytest.fixture(scope="module")
def target(module_processes) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    sim = start_sim(module_processes, time_scale=20.0)
    gw = start_gateway(module_processes, [sim.url], "--no-control", "--initial-limit", "8")
    model = str(get_json(f"{sim.url}/v1/models")["data"][0]["id"])
    return gw.url, model


def check(case: schemathesis.Case, gw: str, model: str) -> None:
    body = case.body
    if isinstance(body, dict) and "model" in body:
        # Most bodies name the served model, so they reach the simulator rather than stopping at a 404.
        if zlib.crc32(json.dumps(body, sort_keys=True, default=str).encode()) % 4:
            body["model"] = model
        if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 64:
            body["max_tokens"] = 64  # long generations add time, not coverage
    response = case.call(base_url=gw, timeout=60)
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, response.text[:500]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=lambda mode: mode.value)
def test_no_request_gets_a_5xx_and_every_error_is_openai_shaped(
    target: tuple[str, str], path: str, mode: schemathesis.GenerationMode
) -> None:
    """Bodies schemathesis draws from each route's schema (``positive``) and from its violations
    (``negative``), driven through hypothesis directly (schemathesis's pytest plugin does not run on this
    pytest)."""
    gw, model = target
    operation = schemathesis.openapi.from_url(f"{gw}/openapi.json").find_operation_by_path("POST", path)
    assert operation is not None, path

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def fuzz(case: schemathesis.Case) -> None:
        check(case, gw, model)

    fuzz()


def test_every_permit_came_back(target: tuple[str, str]) -> None:
    gw, _ = target
    state = get_json(f"{gw}/state")
    assert [u["inflight"] for u in state["upstreams"]] == [0] and state["queue"]["depth"] == 0
