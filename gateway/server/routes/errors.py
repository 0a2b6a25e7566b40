"""Error bodies in the client's dialect.

Every error the gateway produces, its own or an upstream's it cannot pass through, has the shape the
client's SDK parses, so the SDK raises the right exception class and retries what it should:

* OpenAI (chat, completions, embeddings, responses, rerank): ``{"error": {"message", "type", "param",
  "code"}}``; overload is 429 (queue full) or 503 with ``Retry-After``, which the OpenAI SDK honours.
* Anthropic (``/v1/messages``): ``{"type": "error", "error": {"type", "message"}}``; the gateway's 503s become
  529 ``overloaded_error``, as Anthropic's API answers and its SDK retries, with ``retry-after``.

Errors the gateway makes itself also carry ``X-Sweetspot-Reason`` (machine-readable).
"""

from __future__ import annotations

import json
from enum import Enum

from starlette.responses import Response

REASON_HEADER = "x-sweetspot-reason"


class Dialect(Enum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    502: "upstream_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def anthropic_status(status: int) -> int:
    """The status Anthropic's API gives the same condition: "try again soon" is 529, not 503."""
    return 529 if status == 503 else status


def error_body(
    message: str,
    *,
    status: int,
    code: str | None = None,
    param: str | None = None,
    type_: str | None = None,
    dialect: Dialect = Dialect.OPENAI,
) -> dict:
    if dialect is Dialect.ANTHROPIC:
        kind = _ANTHROPIC_TYPES.get(anthropic_status(status), "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {
        "error": {
            "message": message,
            "type": type_ or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    reason: str | None = None,
    retry_after_s: int | None = None,
    request_id: str | None = None,
    dialect: Dialect = Dialect.OPENAI,
) -> Response:
    """A JSON error response; ``reason`` marks it as the gateway's own decision."""
    headers: dict[str, str] = {}
    if reason:
        headers[REASON_HEADER] = reason
    if retry_after_s is not None:
        headers["retry-after"] = str(retry_after_s)
    if request_id:
        headers["x-request-id"] = request_id
    body = json.dumps(error_body(message, status=status, code=code or reason, param=param, dialect=dialect)).encode()
    shown = anthropic_status(status) if dialect is Dialect.ANTHROPIC else status
    return Response(body, status_code=shown, media_type="application/json", headers=headers)


def sse_error_event(
    message: str, *, code: str, status: int = 502, dialect: Dialect = Dialect.OPENAI, named: bool = False
) -> bytes:
    """An error inside a stream that already started, as the client's API sends one: a chat stream's
    ``data: {"error": ...}``, the Responses API's ``event: error``, or Anthropic's ``event: error``. The SDKs
    raise each as an API error."""
    if dialect is Dialect.ANTHROPIC:
        payload = error_body(message, status=status, dialect=dialect)
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
    if named:
        payload = {"type": "error", "code": code, "message": message, "param": None}
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
    return b"data: " + json.dumps(error_body(message, status=status, code=code)).encode() + b"\n\n"
