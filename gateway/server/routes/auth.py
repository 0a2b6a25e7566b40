"""The 401 every route answers when a request presents no key it accepts, counted once as a rejection.

Which key a request presents and whether it matches is :mod:`gateway.server.admission.keys`; this is the
answer, in the client's dialect.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.responses import Response

from gateway.server.routes.errors import Dialect, error_response
from gateway.telemetry.metrics import GatewayMetrics

UNAUTHORIZED = "unauthorized"


def unauthorized(
    metrics: GatewayMetrics, message: str = "invalid or missing API key", dialect: Dialect = Dialect.OPENAI
) -> Response:
    metrics.rejections.labels(UNAUTHORIZED).inc()
    return error_response(401, message, code="invalid_api_key", reason=UNAUTHORIZED, dialect=dialect)


def raw_header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """A request header's raw value from the ASGI scope's list (names come lower-cased)."""
    for key, value in headers:
        if key == name:
            return value
    return None
