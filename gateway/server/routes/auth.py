"""Who may call the gateway: client keys on the OpenAI routes, the admin key on /metrics and /state.

A key is compared as bytes in constant time, so a header with any bytes at all (non-ASCII included) is a
clean 401, never an exception.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.responses import Response

from gateway.server.routes.errors import error_response

_BEARER = b"bearer "


def bearer_token(authorization: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (None for anything else)."""
    if not authorization or authorization[:7].lower() != _BEARER:
        return None
    token = authorization[7:].strip()
    return token or None


def key_matches(authorization: bytes | None, keys: Sequence[bytes]) -> bool:
    token = bearer_token(authorization)
    return token is not None and any(hmac.compare_digest(token, key) for key in keys)


def has_valid_key(authorization: bytes | None, api_key: bytes | None, keys: Sequence[bytes]) -> bool:
    """``Authorization: Bearer <key>`` (OpenAI's SDK) or ``x-api-key: <key>`` (Anthropic's) names a key."""
    if key_matches(authorization, keys):
        return True
    token = api_key.strip() if api_key else b""
    return bool(token) and any(hmac.compare_digest(token, key) for key in keys)


def unauthorized(message: str = "invalid or missing API key") -> Response:
    return error_response(401, message, code="invalid_api_key", reason="unauthorized")


def raw_header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """A request header's raw value from the ASGI scope's list (names come lower-cased)."""
    for key, value in headers:
        if key == name:
            return value
    return None
