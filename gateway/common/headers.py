"""Header names the gateway and its tools agree on: the gateway writes them, the sweep and benchmarks read them.

Kept here, apart from the server, so a tool reads a header's name without importing the request path.
"""

from __future__ import annotations

from typing import Protocol

#: Seconds the request waited in the gateway's queue, on every proxied answer: a client can take it off its own
#: TTFT to see what the backend took (what the TTFT objective judges), and tell the queue from the backend.
QUEUE_HEADER = "x-sweetspot-queue-seconds"
QUEUE_HEADER_BYTES = QUEUE_HEADER.encode()


def queue_header_value(seconds: float) -> str:
    """The queue header's value: seconds with millisecond resolution."""
    return f"{max(seconds, 0.0):.3f}"


class RawHeaders(Protocol):
    """A response's headers as the ASGI message carries them (Starlette's ``Response``)."""

    raw_headers: list[tuple[bytes, bytes]]


def put_header(response: RawHeaders, name: bytes, value: str) -> None:
    """Set the header ``name`` (lower case) of a response the gateway built, in place of any of that name.

    Not ``response.headers[name] = value``: Starlette builds a ``MutableHeaders`` view on each access and its
    assignment re-encodes and rescans the list, about 2.3 us a header against 0.3 us here, on every answer."""
    raw = response.raw_headers
    encoded = value.encode("latin-1")
    for i, (key, _) in enumerate(raw):
        if key == name:
            raw[i] = (name, encoded)
            return
    raw.append((name, encoded))
