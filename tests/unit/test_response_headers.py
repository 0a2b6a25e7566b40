"""The whole answer's response and the gateway's headers on it, built without Starlette's generic header code:
the same response a ``Response`` would be, and one header per name."""

from __future__ import annotations

import pytest
from starlette.responses import Response

from gateway.common.headers import QUEUE_HEADER_BYTES, put_header
from gateway.server.relay.whole_answer import whole_answer
from gateway.server.routes.errors import error_response


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8"])
def test_a_whole_answer_is_the_response_starlette_would_build(content_type: str) -> None:
    payload = b'{"id":"x","choices":[]}'
    built = whole_answer(payload, 200, content_type)
    expected = Response(payload, status_code=200, media_type=content_type)
    assert built.raw_headers == expected.raw_headers
    assert (built.status_code, built.body, built.background) == (200, payload, None)


def test_an_upstream_status_and_an_empty_body_pass_as_they_are() -> None:
    built = whole_answer(b"", 422, "text/plain")
    assert built.status_code == 422
    assert built.raw_headers == [(b"content-length", b"0"), (b"content-type", b"text/plain")]


def test_put_header_adds_a_header_once_and_replaces_one_already_there() -> None:
    response = error_response(429, "slow down", reason="queue_full", request_id="from-the-route")
    put_header(response, b"x-request-id", "the-gateways")
    put_header(response, QUEUE_HEADER_BYTES, "0.125")
    put_header(response, QUEUE_HEADER_BYTES, "0.250")
    names = [name for name, _ in response.raw_headers]
    assert names.count(b"x-request-id") == 1 and names.count(QUEUE_HEADER_BYTES) == 1
    assert response.headers["x-request-id"] == "the-gateways"
    assert response.headers[QUEUE_HEADER_BYTES.decode()] == "0.250"
    assert response.headers["x-sweetspot-reason"] == "queue_full"  # the others stay as they were
    assert response.headers["content-type"] == "application/json"
