"""The upstreams the gateway knows: their limiter, measurement window, health and served models.

Health and models are written by the health poll (:mod:`gateway.server.health`), and health also by a
request that could not connect (:meth:`Upstream.mark_down`); a request for a model no upstream serves
gets a 404 instead of a slot, and a request goes only to upstreams that serve its model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gateway.control.window import SlidingWindow
from gateway.server.admission import Limiter


@dataclass
class Upstream:
    """One backend server and everything the gateway tracks about it."""

    url: str
    limiter: Limiter
    window: SlidingWindow
    models: list[dict[str, Any]] | None = None  # None: not known (listing failed or unsupported)
    healthy: bool = True
    health_error: str | None = None
    last_health_check: float | None = None
    silent_probes: int = 0  # health polls in a row that got no answer
    # Streams may stay on pooled connections: set once the backend is known to keep a connection usable
    # after a streamed reply (vLLM). Until then, and for llama-server, streams ask for "Connection: close".
    streams_keep_alive: bool = False

    @property
    def name(self) -> str:
        return self.url

    def mark_down(self, error: str) -> None:
        """A request found the upstream unreachable: out of rotation until the health poll brings it back."""
        self.healthy = False
        self.health_error = error

    def serves(self, model: str) -> bool:
        """Unknown model lists serve everything: never refuse on missing information."""
        return self.models is None or any(entry.get("id") == model for entry in self.models)


class UpstreamPool:
    """All upstreams, looked up by URL, plus the health/model polling they need."""

    def __init__(self, upstreams: list[Upstream]) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is required")
        self.upstreams = upstreams
        self.by_name = {upstream.name: upstream for upstream in upstreams}

    def __iter__(self) -> Iterator[Upstream]:
        return iter(self.upstreams)

    def eligible(self, model: str) -> list[str]:
        return [upstream.name for upstream in self.upstreams if upstream.serves(model)]

    def models_known(self) -> bool:
        return all(upstream.models is not None for upstream in self.upstreams)

    def all_models(self) -> list[dict[str, Any]]:
        """The union of the upstreams' model lists, first listing wins for duplicate ids."""
        seen: dict[str, dict[str, Any]] = {}
        for upstream in self.upstreams:
            for entry in upstream.models or []:
                seen.setdefault(str(entry.get("id")), entry)
        return list(seen.values())

    def any_healthy(self) -> bool:
        return any(upstream.healthy for upstream in self.upstreams)
