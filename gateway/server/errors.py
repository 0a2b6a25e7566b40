"""OpenAI-shaped error bodies.

Every error the gateway produces, its own or an upstream's it cannot pass through, is
``{"error": {"message", "type", "param", "code"}}`` so the OpenAI SDK raises the right exception
class. Errors the gateway makes itself also carry ``X-Sweetspot-Reason`` (machine-readable) and, for
overload, ``Retry-After`` (the SDK honours it when it retries).
"""

from __future__ import annotations

import json

from starlette.responses import Response

REASON_HEADER = "x-sweetspot-reason"

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


def error_body(message: str, *, status: int, code: str | None = None, param: str | None = None,
               type_: str | None = None) -> dict:
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
) -> Response:
    """A JSON error response; ``reason`` marks it as the gateway's own decision."""
    headers: dict[str, str] = {}
    if reason:
        headers[REASON_HEADER] = reason
    if retry_after_s is not None:
        headers["retry-after"] = str(retry_after_s)
    if request_id:
        headers["x-request-id"] = request_id
    body = json.dumps(error_body(message, status=status, code=code or reason, param=param)).encode()
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def sse_error_event(message: str, *, code: str, status: int = 502) -> bytes:
    """An error delivered inside a stream that already started: the SDK raises it as an APIError."""
    return b"data: " + json.dumps(error_body(message, status=status, code=code)).encode() + b"\n\n"
