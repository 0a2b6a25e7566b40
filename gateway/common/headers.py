"""Header names the gateway and its tools agree on: the gateway writes them, the sweep and benchmarks read them.

Kept here, apart from the server, so a tool reads a header's name without importing the request path.
"""

from __future__ import annotations

#: Seconds the request waited in the gateway's queue, on every proxied answer: a client can take it off its own
#: TTFT to see what the backend took (what the TTFT objective judges), and tell the queue from the backend.
QUEUE_HEADER = "x-sweetspot-queue-seconds"


def queue_header_value(seconds: float) -> str:
    """The queue header's value: seconds with millisecond resolution."""
    return f"{max(seconds, 0.0):.3f}"
