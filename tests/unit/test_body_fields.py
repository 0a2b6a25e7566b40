"""A request's path reads the fields of its parsed body with ``validation.field_of`` and ``has_field``, never
through pydantic's ``__getattr__``, which formats and raises an ``AttributeError`` for every name a model lacks
(a chat body's ``prompt``, ``previous_response_id``): a few microseconds each, per request. Each route's schema is
parsed from a body of its own API, with its ``__getattr__`` made to fail, and read as the request path reads it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pydantic import BaseModel

from gateway.server.admission.prompt_size import estimated_kv_tokens
from gateway.server.admission.routing import prompt_text
from gateway.server.routes.table import ROUTES, Route
from gateway.server.routes.validation import field_of, has_field, parse_body, sequences

MESSAGES = [{"role": "user", "content": "What is a sweet spot?"}]
BODIES = {
    "/v1/chat/completions": {"model": "m", "messages": MESSAGES, "n": 2, "max_tokens": 16},
    "/v1/completions": {"model": "m", "prompt": ["one", "two"], "max_tokens": 8},
    "/v1/embeddings": {"model": "m", "input": "embed me"},
    "/v1/responses": {"model": "m", "input": "hello", "previous_response_id": "resp_1", "max_output_tokens": 32},
    "/v1/messages": {"model": "m", "messages": MESSAGES, "max_tokens": 64, "system": "be brief"},
    "/v1/rerank": {"model": "m", "query": "q", "documents": ["a", "b"]},
    "/v1/score": {"model": "m", "text_1": "a", "text_2": "b"},
}
#: Every field the request path asks a body for, on any route.
ASKED = (
    "n",
    "prompt",
    "previous_response_id",
    "stream",
    "system",
    "messages",
    "input",
    "max_completion_tokens",
    "max_tokens",
    "max_output_tokens",
)


@pytest.fixture
def absent_fields_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: BaseModel, name: str) -> None:
        raise AssertionError(f"{type(self).__name__}.{name} was read through pydantic's __getattr__")

    for route in ROUTES:
        monkeypatch.setattr(route.schema, "__getattr__", refuse)


def parsed(route: Route) -> BaseModel:
    return parse_body(route.schema, json.dumps(BODIES[route.path]).encode())


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: route.path)
@pytest.mark.usefixtures("absent_fields_fail")
def test_the_request_path_reads_a_bodys_fields_without_pydantics_getattr(route: Route) -> None:
    body = parsed(route)
    with pytest.raises(AssertionError):  # the trap is set: getattr with a default would fall into it
        getattr(body, "no_such_field", None)
    for name in ASKED:
        assert field_of(body, name) == (getattr(body, name) if has_field(body, name) else None)
    sequences(body)
    prompt_text(body)
    estimated_kv_tokens(body)


@pytest.mark.usefixtures("absent_fields_fail")
def test_fields_read_what_each_api_has_and_none_for_what_it_has_not() -> None:
    chat, completion, embedding, responses = (parsed(route) for route in ROUTES[:4])
    assert field_of(chat, "n") == 2 and field_of(chat, "prompt") is None
    assert field_of(completion, "prompt") == ["one", "two"] and sequences(completion) == 2
    assert sequences(chat) == 2
    assert has_field(responses, "previous_response_id") and not has_field(embedding, "previous_response_id")
    assert field_of(responses, "previous_response_id") == "resp_1"
    assert prompt_text(responses) == "\x1euser\x1fhello"  # the Responses API's input, as the router reads it
    assert prompt_text(embedding) is None


def test_anything_else_is_read_with_getattr() -> None:
    body = SimpleNamespace(n=3)
    assert field_of(body, "n") == 3 and field_of(body, "prompt") is None
    assert has_field(body, "n") and not has_field(body, "prompt")
