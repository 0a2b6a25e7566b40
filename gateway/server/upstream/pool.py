"""The upstreams the gateway knows: their limiter, measurement window, health and served models.

Health and models are written by the health poll (:mod:`gateway.server.upstream.health`), and health also by the
request path (:meth:`Upstream.mark_down`: a refused connection, or requests that keep timing out while
``/health`` still answers); a request for a model no upstream serves gets a 404 instead of a slot, and a
request goes only to upstreams that serve its model. Clients are told an upstream's ``public_name``,
never its URL.

A client's model name becomes the served name here (:meth:`UpstreamPool.resolve`): an alias
(``model_aliases``), the ``default_model`` for a name no upstream lists, or, without a default, the name itself
on an upstream that answers any name (llama-server serving one model, as the backend scrape detects).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.control.knee_search.capacity import Footprint
from gateway.control.window import SlidingWindow
from gateway.server.admission.admission_queue import Limiter
from gateway.settings import Settings, alias_targets

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
    # Set by the backend scrape when the backend is llama-server, which answers whatever model a request names.
    any_name: bool = False
    # A read of the model list asked for by a request's 404 "model not found" (health.refresh_models): the one in
    # flight, and when (gateway clock) the last one began.
    models_refresh: asyncio.Task[None] | None = None
    models_refreshed_at: float = float("-inf")
    # Removed from the configuration (upstreams_file, SIGHUP): takes no new request, finishes what runs, then is
    # dropped from the pool (gateway.server.feedback.membership).
    retiring: bool = False
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
        """Unknown model lists serve everything: never refuse on missing information. A retiring upstream
        serves nothing new."""
        return not self.retiring and (self.models is None or self.lists(model))

    @property
    def takes_any_name(self) -> bool:
        """Whether it may run a request for a name no upstream lists: llama-server serving one model (a
        llama-server that lists several, in router mode, picks by name as vLLM does)."""
        return self.any_name and not self.retiring and (self.models is None or len(self.models) <= 1)

    def lists(self, model: str) -> bool:
        """Whether the upstream's own model list names ``model`` (False while the list is not known)."""
        models = self.models
        if models is None:
            return False
        if models is not self._listed_from:
            self._listed = frozenset(entry["id"] for entry in models if isinstance(entry.get("id"), str))
            self._listed_from = models
        return model in self._listed


class Resolved(NamedTuple):
    """Where a request for one model name goes."""

    served: str  # the name that goes upstream (the client's own unless an alias or the default applied)
    eligible: list[str]  # the upstreams that may run it; empty: nobody serves it (a 404)
    label: str  # the metrics' ``model`` label: the served name, bounded (:meth:`UpstreamPool.model_label`)


class UpstreamPool:
    """All upstreams, looked up by URL, plus the health/model polling they need."""

    def __init__(
        self, upstreams: list[Upstream], *, aliases: dict[str, str] | None = None, default_model: str | None = None
    ) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is required")
        self.upstreams = upstreams
        self.by_name = {upstream.name: upstream for upstream in upstreams}
        self.aliases = alias_targets(aliases or {})  # each alias with the served name it ends at
        self.default_model = self.aliases.get(default_model, default_model) if default_model else None

    def resolve(self, model: str) -> Resolved:
        """The served name for a client's ``model`` and the upstreams that may run it: an alias's served name;
        else the name itself when an upstream lists it (or may: its list is not known); else the default model;
        else, without a default, the name itself on the upstreams that answer any name. The common case (no
        alias, no default) costs one dict lookup more than the model check itself."""
        served = self.aliases.get(model)
        if served is None:
            default = self.default_model
            if default is None or self.listed(model):
                eligible = self.eligible(model)
                return Resolved(model, eligible, self.model_label(model)) if eligible else self._any_name(model)
            served = default
        eligible = self.eligible(served)
        return Resolved(served, eligible, self.model_label(served)) if eligible else self._any_name(served)

    def _any_name(self, served: str) -> Resolved:
        """A name no upstream lists, for the upstreams that answer any name, when they serve one model between
        them (replicas of one llama-server): labelled with it, what ran. Upstreams that answer any name but
        serve different models (a chat model here, an embedding model there) cannot tell which the client
        meant: nobody takes it (a 404), as a name nobody serves."""
        takers = [upstream for upstream in self.upstreams if upstream.takes_any_name]
        ids = {entry.get("id") for upstream in takers for entry in upstream.models or []}
        if len(ids) > 1:
            return Resolved(served, [], OTHER_MODELS)
        label = ids.pop() if ids and all(u.models for u in takers) else None
        return Resolved(served, [u.name for u in takers], label if isinstance(label, str) else OTHER_MODELS)

    def listed(self, model: str) -> bool:
        """Whether any upstream's own list names ``model`` (a retiring one's does not count)."""
        return any(upstream.lists(model) and not upstream.retiring for upstream in self.upstreams)

    def unlisted_targets(self) -> list[str]:
        """A warning for each alias (and the default) whose served name no upstream lists now: requests for it
        are refused until one does (a model loaded later), unless an upstream answers any name."""
        targets = {served: f"model_aliases: {alias!r}" for alias, served in self.aliases.items()}
        if self.default_model is not None:
            targets.setdefault(self.default_model, "default_model")
        return [
            f"{where} names {served!r}, which no upstream lists now; requests for it get 404 until one does "
            "(a model loaded later, or an upstream that answers any name, such as llama-server)"
            for served, where in targets.items()
            if not self.listed(served)
        ]

    def __iter__(self) -> Iterator[Upstream]:
        return iter(self.upstreams)

    def add(self, upstream: Upstream) -> None:
        """A new upstream joins (gateway.server.feedback.membership wires it to the queue and the controllers)."""
        if upstream.name in self.by_name:
            raise ValueError(f"upstream {upstream.name} is already in the pool")
        self.upstreams = [*self.upstreams, upstream]  # a new list: a loop iterating the old one is not disturbed
        self.by_name[upstream.name] = upstream

    def remove(self, name: str) -> Upstream:
        """Drop an upstream (retired, nothing running on it any more)."""
        upstream = self.by_name.pop(name)
        self.upstreams = [u for u in self.upstreams if u is not upstream]
        return upstream

    def model_label(self, model: str) -> str:
        """The ``model`` label value for a request's metrics: the name when an upstream lists it, else
        :data:`OTHER_MODELS`. An upstream whose list cannot be read (a timeout, a 401) serves any name, and a
        client could otherwise mint one series per name it sends."""
        return model if self.listed(model) else OTHER_MODELS

    def eligible(self, model: str) -> list[str]:
        return [upstream.name for upstream in self.upstreams if upstream.serves(model)]

    def models_known(self) -> bool:
        return all(upstream.models is not None for upstream in self.upstreams if not upstream.retiring)

    def all_models(self) -> list[dict[str, Any]]:
        """The union of the upstreams' model lists, first listing wins for duplicate ids; then each alias whose
        served name is served now, saying what it is an alias of (an alias takes the place of a listed id)."""
        seen: dict[str, dict[str, Any]] = {}
        for upstream in self.upstreams:
            if upstream.retiring:
                continue
            for entry in upstream.models or []:
                seen.setdefault(str(entry.get("id")), entry)
        for alias, served in self.aliases.items():
            if self.resolve(alias).eligible:
                target = seen.get(served, {})
                created = target.get("created")
                seen[alias] = {
                    "id": alias,
                    "object": "model",
                    "created": created if isinstance(created, int) else 0,
                    "owned_by": f"alias of {served}",
                    "root": served,
                }
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
