"""The upstreams the gateway knows: their limiter, measurement window, health and served models.

Health and models are written by the health poll (:mod:`gateway.server.upstream.health`), and health also by the
request path (:meth:`Upstream.mark_down`: a refused connection, or requests that keep timing out while
``/health`` still answers); a request for a model no upstream serves gets a 404 instead of a slot, and a
request goes only to upstreams that serve its model. Clients are told an upstream's ``public_name``,
never its URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gateway.control.knee_search.capacity import Footprint
from gateway.control.window import SlidingWindow
from gateway.server.admission.admission_queue import Limiter
from gateway.settings import Settings

#: The ``model`` label of requests for a name no upstream lists.
OTHER_MODELS = "other"


@dataclass
class Upstream:
    """One backend server and everything the gateway tracks about it."""

    url: str
    limiter: Limiter
    window: SlidingWindow
    public_name: str = "upstream"
    models: list[dict[str, Any]] | None = None  # None: not known (listing failed or unsupported)
    healthy: bool = True
    health_error: str | None = None  # why it is down, naming no host (/readyz shows it)
    health_detail: str | None = None  # the exception's own words, host and port included (/state only)
    last_health_check: float | None = None
    silent_probes: int = 0  # health polls in a row that got no answer
    timeouts_in_a_row: int = 0  # requests in a row that timed out
    down_until: float = 0.0  # (monotonic) the health poll may not bring it back before this
    # Streams may stay on pooled connections: set once the backend is known to keep a connection usable
    # after a streamed reply (vLLM). Until then, and for llama-server, streams ask for "Connection: close".
    streams_keep_alive: bool = False
    _footprint: Footprint | None = None
    # The ids of ``models``, as a set, and the list they were read from: every request asks whether an upstream
    # lists its model, and the list is replaced (never changed in place) when the health poll reads it again.
    _listed: frozenset[str] = frozenset()
    _listed_from: list[dict[str, Any]] | None = None

    @property
    def name(self) -> str:
        return self.url

    def request_footprint(self, now: float) -> Footprint | None:
        """The KV a typical request takes, from the window's requests (``Footprint.update``: the last known
        when too few ended within it)."""
        self._footprint = Footprint.update(self._footprint, self.window.samples(now))
        return self._footprint

    def mark_down(self, error: str, *, until: float = 0.0) -> None:
        """The request path found the upstream unusable: out of rotation until the health poll brings it
        back, and not before ``until``. ``error`` names the upstream by its public name only."""
        self.healthy = False
        self.health_error = error
        self.health_detail = None
        self.down_until = max(self.down_until, until)

    def request_ended(self, timed_out: bool, *, timeouts_to_down: int, now: float, hold_s: float) -> None:
        """Count timeouts in a row; past ``timeouts_to_down`` the upstream is taken out for ``hold_s``."""
        if not timed_out:
            self.timeouts_in_a_row = 0
            return
        self.timeouts_in_a_row += 1
        if self.timeouts_in_a_row >= timeouts_to_down and self.healthy:
            self.mark_down(f"{self.timeouts_in_a_row} requests in a row timed out", until=now + hold_s)

    def serves(self, model: str) -> bool:
        """Unknown model lists serve everything: never refuse on missing information."""
        return self.models is None or self.lists(model)

    def lists(self, model: str) -> bool:
        """Whether the upstream's own model list names ``model`` (False while the list is not known)."""
        models = self.models
        if models is None:
            return False
        if models is not self._listed_from:
            self._listed = frozenset(entry["id"] for entry in models if isinstance(entry.get("id"), str))
            self._listed_from = models
        return model in self._listed


class UpstreamPool:
    """All upstreams, looked up by URL, plus the health/model polling they need."""

    def __init__(self, upstreams: list[Upstream]) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is required")
        self.upstreams = upstreams
        self.by_name = {upstream.name: upstream for upstream in upstreams}

    def __iter__(self) -> Iterator[Upstream]:
        return iter(self.upstreams)

    def model_label(self, model: str) -> str:
        """The ``model`` label value for a request's metrics: the name when an upstream lists it, else
        :data:`OTHER_MODELS`. An upstream whose list cannot be read (a timeout, a 401) serves any name, and a
        client could otherwise mint one series per name it sends."""
        return model if any(upstream.lists(model) for upstream in self.upstreams) else OTHER_MODELS

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

    def widest_admitted(self, eligible: list[str], settings: Settings) -> int:
        """The most sequences one request may run on any of ``eligible``: ``max_request_sequences``, and never
        more than an upstream's limit could ever be (its static limit without the controller; ``limit_max``
        and ``backend_max_seqs`` with it), so a request that could never be admitted is told so at once."""
        ceiling = settings.limit_max
        if settings.backend_max_seqs:
            ceiling = min(ceiling, settings.backend_max_seqs)
        widest = max(
            (self.by_name[name].limiter.limit if not settings.control_enabled else ceiling) for name in eligible
        )
        return min(settings.max_request_sequences, widest)
