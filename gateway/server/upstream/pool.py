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
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gateway.control.knee_search.capacity import Footprint
from gateway.control.knee_search.kv_estimate import PromptEstimates, admission_cap
from gateway.control.window import SlidingWindow
from gateway.server.admission.limiter import Limiter
from gateway.settings import Settings, alias_targets
from gateway.telemetry.backends.snapshot import LoraState

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
    # The KV cache's size, (tokens, block size or None), as the backend publishes it (vLLM's cache_config_info) or
    # kv_capacity_tokens plans it; set at each scrape, None while unknown.
    kv_size: tuple[int, int | None] | None = None
    # Whether the limit comes down to the KV cache's cap before each admission (the built-in controller; a
    # baseline algorithm or a fixed limit reads no hard cap).
    holds_kv_cap: bool = False
    # The KV of the requests that may run here, estimated from their bodies, until a footprint is measured.
    kv_estimates: PromptEstimates = field(default_factory=PromptEstimates)
    # Whether anything reads those estimates: a control tick (control on) of a backend whose KV cache's size is
    # known or not yet reported. False skips estimating each request's size (control off, llama-server).
    kv_estimates_read: bool = True
    # The LoRA state of vLLM's last scrape (vllm:lora_requests_info): adapters running and waiting, max_lora. None:
    # not reported (no --enable-lora, not vLLM, not scraped yet).
    lora: LoraState | None = None
    _footprint: Footprint | None = None
    # The ids of ``models``, as a set, and the list they were read from: every request asks whether an upstream
    # lists its model, and the list is replaced (never changed in place) when the health poll reads it again.
    _listed: frozenset[str] = frozenset()
    _adapters: frozenset[str] = frozenset()  # of those, the LoRA adapters (entries with a parent)
    _listed_from: list[dict[str, Any]] | None = None

    @property
    def name(self) -> str:
        return self.url

    def request_footprint(self, now: float) -> Footprint | None:
        """The KV a typical request takes, from the window's requests (``Footprint.update``: the last known
        when too few ended within it)."""
        self._footprint = Footprint.update(self._footprint, self.window.samples(now))
        return self._footprint

    def kv_footprint(self, now: float) -> Footprint | None:
        """The footprint the hard cap counts: the measured one, else the admitted requests' estimated one."""
        measured = self.request_footprint(now)
        return measured if measured is not None else self.kv_estimates.footprint()

    @property
    def estimating_kv(self) -> bool:
        """Whether a request's estimated KV still counts here: no footprint measured yet, and something reads it."""
        return self._footprint is None and self.kv_estimates_read

    def admitting(self, kv_tokens: int) -> None:
        """A request whose KV is estimated at ``kv_tokens`` (``prompt_size.estimated_kv_tokens``) may be admitted
        here next. Until a footprint is measured, its estimate joins the admitted requests' and, where the limit
        holds the hard cap, the limit comes down at once to what the KV cache holds of them
        (``kv_estimate.admission_cap``): the first requests meet the cap before the first control tick, which
        then takes the same cap as its observation. Never raises the limit."""
        if self._footprint is not None:
            return
        self.kv_estimates.note(kv_tokens)
        if not self.holds_kv_cap or self.kv_size is None:
            return
        capacity, block = self.kv_size
        lowered = admission_cap(self.limiter.limit, capacity, block, self.kv_estimates)
        if lowered is not None:
            self.limiter.set_limit(lowered)

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
        self._read_list(models)
        return model in self._listed

    @property
    def adapters(self) -> frozenset[str]:
        """The LoRA adapters its model list names: entries with a ``parent`` (vLLM lists an adapter so, the base
        model it applies to as parent)."""
        if self.models is None:
            return frozenset()
        self._read_list(self.models)
        return self._adapters

    def _read_list(self, models: list[dict[str, Any]]) -> None:
        if models is self._listed_from:
            return
        self._listed = frozenset(entry["id"] for entry in models if isinstance(entry.get("id"), str))
        self._adapters = frozenset(
            entry["id"] for entry in models if isinstance(entry.get("id"), str) and entry.get("parent")
        )
        self._listed_from = models


class Resolved(NamedTuple):
    """Where a request for one model name goes."""

    served: str  # the name that goes upstream (the client's own unless an alias or the default applied)
    eligible: list[str]  # the upstreams that may run it; empty: nobody serves it (a 404)
    # The metrics' ``model`` label: the served name when an upstream lists it, else OTHER_MODELS. An upstream
    # whose list cannot be read (a timeout, a 401) serves any name, and a client could otherwise mint one series
    # per name it sends.
    label: str


class UpstreamPool:
    """All upstreams, looked up by URL, plus the health/model polling they need."""

    def __init__(
        self, upstreams: list[Upstream], *, aliases: dict[str, str] | None = None, default_model: str | None = None
    ) -> None:
        # Empty only while a configuration of dns+ names alone has no address yet (Gateway.build refuses one that
        # lists nothing): requests get 503 no_upstream until the names resolve (gateway.server.feedback.membership).
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
            eligible, listed = self._serving(model)
            if self.default_model is not None and not listed:
                served = self.default_model
                eligible, listed = self._serving(served)
            else:
                served = model
        else:
            eligible, listed = self._serving(served)
        if not eligible:
            return self._any_name(served)
        return Resolved(served, eligible, served if listed else OTHER_MODELS)

    def _serving(self, model: str) -> tuple[list[str], bool]:
        """The upstreams that may run ``model``, and whether any lists it, in one pass (every request asks both).
        An upstream whose model list is unknown serves everything: never refuse on missing information. A
        retiring one serves nothing new, and its list does not count."""
        eligible: list[str] = []
        listed = False
        for upstream in self.upstreams:
            if upstream.retiring:
                continue
            if upstream.lists(model):
                listed = True
                eligible.append(upstream.name)
            elif upstream.models is None:
                eligible.append(upstream.name)
        return eligible, listed

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

    def is_adapter(self, model: str) -> bool:
        """Whether an upstream lists ``model`` as a LoRA adapter (LoRA affinity routes its requests)."""
        return any(model in upstream.adapters for upstream in self.upstreams if not upstream.retiring)

    def lora_state(self, name: str) -> LoraState | None:
        """The last scraped LoRA state of the upstream ``name`` (None: not reported, or no such upstream)."""
        upstream = self.by_name.get(name)
        return upstream.lora if upstream is not None else None

    def listed(self, model: str) -> bool:
        """Whether any upstream's own list names ``model`` (a retiring one's does not count)."""
        return self._serving(model)[1]

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

    def eligible(self, model: str) -> list[str]:
        """The upstreams that may run ``model`` (see :meth:`_serving`)."""
        return self._serving(model)[0]

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
        if settings.control_enabled:
            widest = settings.limit_max
            if settings.backend_max_seqs:
                widest = min(widest, settings.backend_max_seqs)
        else:
            by_name = self.by_name
            widest = max(by_name[name].limiter.limit for name in eligible)
        return min(settings.max_request_sequences, widest)
