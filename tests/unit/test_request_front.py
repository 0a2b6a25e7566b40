"""The request front of the proxied routes: headers read in one pass, the body parsed and validated in
one go, and ``stream_options.include_usage`` asked of the upstream without rewriting the client's bytes."""

from __future__ import annotations

import json

import pytest

from gateway.server.admission.keys import KeyRing
from gateway.server.routes.inbound import RequestHeaders
from gateway.server.routes.validation import (
    BadRequest,
    ChatRequest,
    CompletionRequest,
    parse_body,
    with_usage_requested,
)


def test_usage_is_spliced_in_and_every_other_byte_kept() -> None:
    body = (
        '{ "model" : "m",\n  "messages": [{"role": "user", "content": "héllo \\u00e9"}], "stream": true }\n'
    ).encode()
    out = with_usage_requested(body, None)
    end = body.rindex(b"}")
    assert out.startswith(body[:end])  # spacing, key order, raw UTF-8 and escapes as the client sent them
    assert out.endswith(b"}\n")
    assert json.loads(out) == {**json.loads(body), "stream_options": {"include_usage": True}}


def test_existing_stream_options_are_kept_and_usage_added() -> None:
    body = json.dumps(
        {"model": "m", "prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}}
    ).encode()
    out = json.loads(with_usage_requested(body, {"continuous_usage_stats": True}))
    assert out["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}


def test_a_null_stream_options_is_replaced_not_duplicated() -> None:
    body = b'{"model": "m", "prompt": "x", "stream": true, "stream_options": null}'
    out = with_usage_requested(body, None)
    assert out.count(b'"stream_options"') == 1
    assert json.loads(out)["stream_options"] == {"include_usage": True}


def test_the_key_inside_a_string_is_not_mistaken_for_the_field() -> None:
    body = json.dumps({"model": "m", "prompt": 'say "stream_options"', "stream": True}).encode()
    out = with_usage_requested(body, None)
    assert json.loads(out)["prompt"] == 'say "stream_options"'
    assert json.loads(out)["stream_options"] == {"include_usage": True}


def test_request_headers_are_read_in_one_pass() -> None:
    raw = [
        (b"host", b"x"),
        (b"content-length", b"42"),
        (b"authorization", b"Bearer k"),
        (b"x-request-id", b"abc"),
        (b"x-priority", b"5"),
        (b"content-type", b"application/json; charset=utf-8"),
    ]
    headers = RequestHeaders(raw, "X-Priority")
    assert (headers.authorization, headers.content_length, headers.request_id, headers.priority) == (
        b"Bearer k",
        "42",
        "abc",
        "5",
    )
    assert headers.is_json
    empty = RequestHeaders([(b"x-request-id", b"")], "x-priority")
    assert empty.request_id is None and empty.authorization is None and empty.priority is None
    assert not empty.is_json


@pytest.mark.parametrize("value", [b"a" * 129, b"has space", b"caf\xc3\xa9", b"tab\there", b""])
def test_a_long_or_unprintable_request_id_is_not_taken(value: bytes) -> None:
    assert RequestHeaders([(b"x-request-id", value)], "x-priority").request_id is None


@pytest.mark.parametrize(
    "content_type",
    [b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x", b"application/jsonx"],
)
def test_bodies_that_a_browser_form_can_send_are_not_json(content_type: bytes) -> None:
    assert not RequestHeaders([(b"content-type", content_type)], "x-priority").is_json


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (b"Bearer k1", True),
        (b"bearer k2", True),
        (b"Bearer  k1 ", True),
        (b"Bearer k3", False),
        (b"Basic k1", False),
        (b"Bearer \xff\xfe", False),
        (b"\xe2\x82\xac", False),
        (None, False),
        (b"Bearer ", False),
    ],
)
def test_keys_are_compared_as_bytes_and_anything_malformed_is_refused(header: bytes | None, ok: bool) -> None:
    ring = KeyRing([("k1", "one"), ("k2", "two")])
    assert (ring.find(header, None) is not None) is ok
    assert (ring.find(None, header) is not None) is (ok and header is not None and header.strip() in (b"k1", b"k2"))


def test_a_key_is_found_under_either_header_and_the_bearer_token_first() -> None:
    ring = KeyRing([("k1", "one"), ("k2", "two")])
    assert ring.find(None, b" k2 ") == "two"  # x-api-key, as Anthropic's SDK sends it
    assert ring.find(b"Bearer k1", b"k2") == "one"
    assert ring.find(b"Bearer nope", b"k2") == "two"
    assert ring.find(b"Bearer nope", b"nope") is None
    assert not KeyRing([]) and KeyRing([("k", 1)])


@pytest.mark.parametrize(
    ("body", "message", "code", "param"),
    [
        (b"", "request body is empty", "invalid_json", None),
        (b"  \n", "request body is empty", "invalid_json", None),
        (b"{not json", "request body is not valid JSON", "invalid_json", None),
        (b"\xff\xfe", "request body is not valid JSON", "invalid_json", None),
        (b"[1, 2]", "request body must be a JSON object", "invalid_json", None),
        (b'"text"', "request body must be a JSON object", "invalid_json", None),
        (b'{"messages": [{"role": "user"}]}', "model: Field required", None, "model"),
        (
            b'{"model": "m", "messages": [], "stream": true}',
            "messages: List should have at least 1 item",
            None,
            "messages",
        ),
        (
            b'{"model": "m", "messages": [{}], "stream": "yes"}',
            "stream: Input should be a valid boolean",
            None,
            "stream",
        ),
        (
            b'{"model": "m", "messages": [{}], "max_tokens": 1.5}',
            "max_tokens: Input should be a valid integer",
            None,
            "max_tokens",
        ),
    ],
)
def test_bad_bodies_name_their_first_problem(body: bytes, message: str, code: str | None, param: str | None) -> None:
    with pytest.raises(BadRequest) as info:
        parse_body(ChatRequest, body)
    assert str(info.value).startswith(message)
    assert (info.value.code, info.value.param) == (code, param)


def test_a_good_body_validates_and_unknown_fields_are_not_kept() -> None:
    parsed = parse_body(
        CompletionRequest,
        b'{"model": "m", "prompt": [1, 2], "stream": true, "top_k": 5, "stream_options": {"include_usage": false}}',
    )
    assert parsed.model == "m" and parsed.stream is True
    assert parsed.stream_options == {"include_usage": False}
    assert parsed.model_extra is None  # forwarded in the original bytes, never read
