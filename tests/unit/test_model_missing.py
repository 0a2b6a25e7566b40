"""Which 404 bodies say the model does not exist (``upstream_client.model_missing``): the request was not run, and
the upstream's model list is stale."""

from __future__ import annotations

import json

import pytest

from gateway.server.upstream.upstream_client import model_missing

MESSAGE = "The model `sql-lora` does not exist."


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": MESSAGE, "type": "NotFoundError", "param": None, "code": 404}},  # vLLM 0.10 on
        {"object": "error", "message": MESSAGE, "type": "NotFoundError", "param": None, "code": 404},  # before
        {"error": {"message": "no such thing", "type": "invalid_request_error", "code": "model_not_found"}},  # OpenAI
        {"error": {"message": "model not found", "type": "not_found_error", "code": 404}},  # llama-server's router
    ],
)
def test_a_model_not_found_body_is_one(body: dict) -> None:
    assert model_missing(json.dumps(body).encode())


@pytest.mark.parametrize(
    "payload",
    [
        json.dumps({"error": {"message": "Response with id 'resp_1' not found.", "type": "NotFoundError"}}).encode(),
        json.dumps({"detail": "Not Found"}).encode(),  # a route the server lacks (FastAPI's own 404)
        json.dumps({"object": "list", "message": MESSAGE}).encode(),
        json.dumps(["model does not exist"]).encode(),
        b"model does not exist",  # not JSON
    ],
)
def test_any_other_404_body_is_not(payload: bytes) -> None:
    assert not model_missing(payload)
