"""Every knob of the gateway, in one pydantic-settings class.

Precedence, highest first: command-line flags (passed as keyword arguments), ``SWEETSPOT_*``
environment variables, a TOML file (``--config`` / ``SWEETSPOT_CONFIG``), then the defaults below.
Nothing else in the code base reads the environment: a reader looking for a knob finds it here.

The fields are declared in sections, one small class each (:data:`SECTIONS`), which :class:`Settings`
inherits all of: a section is data, so ``sweetspot serve --help`` groups its flags (one per field,
generated in :mod:`gateway.cli.serve`) the way this file does.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from gateway.control.baselines import BUILT_IN
from gateway.control.config import ControllerKnobs

_TOML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("sweetspot_toml", default=None)

BackendKind = Literal["auto", "vllm", "llamacpp", "openai"]


def _split_csv(value: Any) -> Any:
    """Accept ``a,b`` as well as JSON lists from the environment, and lists from TOML/flags."""
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            import json

            return json.loads(value)
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


#: The label value every tenant without an entry of its own in ``tenants`` shares in the metrics.
OTHER_TENANTS = "other"


class TenantConfig(BaseModel):
    """One tenant: who it is (its keys), its share of the gateway, and its caps. A TOML ``[[tenants]]`` table,
    or a JSON list in ``SWEETSPOT_TENANTS``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="The tenant's name; its metrics label and its name in /state.",
    )
    api_keys: list[str] = Field(
        default_factory=list, description="Client keys (Authorization: Bearer) that identify this tenant."
    )
    weight: float = Field(
        1.0,
        description="Share of the slots when the limit is contended, relative to the "
        "other tenants with requests queued in the same priority class.",
    )
    priority: str | None = Field(
        None, description="Priority class of its requests (one of priority_classes; default: default_priority)."
    )
    max_priority: str | None = Field(
        None,
        description="Highest class its clients may ask for with the priority "
        "header (default: its own priority: it cannot raise it).",
    )
    max_inflight: int | None = Field(None, ge=1, description="Most of its requests running at once; more wait.")
    max_queued: int | None = Field(None, ge=0, description="Most of its requests queued at once; more get 429.")
    output_tokens_per_minute: int | None = Field(
        None,
        ge=1,
        description="Output-token quota: a bucket of this many tokens refilled continuously; "
        "past it new requests get 429 until it is positive again.",
    )


class ListeningKnobs(BaseModel):
    """Where the gateway listens, in how many processes, and what a client connection may hold before its
    request is read."""

    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0 in containers).")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on.")
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Names a request's Host header may carry (any port): `example.com`, `*.example.com` for its "
        "subdomains, `*` for any. Others get a 421 before any route, health routes included (a page a browser "
        "loaded from elsewhere cannot reach a loopback gateway through DNS rebinding). Empty: localhost, "
        "127.0.0.1 and [::1] when the gateway listens on loopback without client keys, else any host.",
    )

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _hosts_csv(cls, value: Any) -> Any:
        return _split_csv(value)

    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Worker processes serving the one port (SO_REUSEPORT: the kernel spreads connections over "
        "them), so one host uses its cores: one process streams only as many chunks per second as one core "
        "relays (docs/deploy.md has the measurement). Each is an independent replica with its own controllers; "
        "per-worker limit_max x workers must stay within what the backend admits (docs/deploy.md).",
    )
    max_connections: int = Field(
        4096,
        ge=1,
        description="Client connections open at once; one more is answered 503 with Retry-After and closed. "
        "Bounds what idle or slow clients can hold (each costs a socket and a little memory).",
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest request head (request line and headers together); beyond it the gateway answers 431 "
        "and closes the connection without buffering the rest. OpenAI SDK requests send about 1 KB.",
    )
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, description="Largest request body accepted; larger gets 413.")
    max_response_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="Largest whole (not streamed) answer the gateway reads from an upstream; past it the client gets "
        "an OpenAI-shaped 502 `response_too_large`. A streamed answer is passed on event by event, and one event "
        "(part of an answer) may not exceed it either: past it the stream ends with an error event "
        "(`upstream_event_too_large`), so an upstream that never ends an event costs at most this much memory.",
    )
    request_read_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest a client may take to send a request's headers, and then its body, once it began "
        "(a slowloris defence): past it, 408 and the connection closed. A connection that sends nothing is "
        "closed after the same time.",
    )
    drain_timeout_s: float = Field(
        300.0,
        ge=0,
        description="On SIGTERM: how long running requests may take to finish. /readyz turns 503 at once, new and "
        "queued requests get 503 with Retry-After (a retrying SDK lands on another replica), running streams "
        "go on; one still running at the deadline ends with an error event. 5 minutes holds a long generation "
        "(8K tokens at 30 tokens/s); the orchestrator's grace period must exceed it (docs/deploy.md).",
    )


class UpstreamKnobs(BaseModel):
    """The inference servers behind the gateway, and how their health is followed."""

    upstreams: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Base URLs of the inference servers, e.g. http://vllm:8000; or a name whose every address "
        "(A and AAAA) is one, re-resolved every discovery_interval_s: dns+http://vllm.llm.svc.cluster.local:8000 "
        "(a headless Service; docs/deploy.md).",
    )
    backend: BackendKind = Field(
        "auto", description="Backend type for reading its /metrics; 'auto' detects it from what the server answers."
    )
    upstream_api_key: str | None = Field(
        None, description="Bearer token the gateway sends upstream instead of the client's."
    )
    upstreams_file: Path | None = Field(
        None,
        description="A file of upstream base URLs, one a line (`#` starts a comment), re-read when it changes "
        "(every discovery_interval_s) and on SIGHUP; united with `upstreams`. Upstreams added there join "
        "without a restart, those removed finish what runs and leave (docs/deploy.md).",
    )
    discovery_interval_s: float = Field(
        5.0,
        gt=0,
        description="How often upstreams_file is checked for changes (its mtime and content) and the dns+ "
        "names among the upstreams are resolved again.",
    )
    discovery_nameserver: str | None = Field(
        None,
        description="The DNS server that resolves the dns+ upstreams, as ADDRESS:PORT (127.0.0.1:5353, "
        "[::1]:5353; port 53 when left out); unset: the system's resolver (/etc/hosts, resolv.conf's search "
        "domains). A name that fails to resolve or has no address keeps its last good addresses.",
    )
    health_interval_s: float = Field(2.0, gt=0, description="How often each upstream's health is polled.")
    upstream_timeouts_to_down: int = Field(
        3,
        ge=1,
        description="Timeouts in a row after which an upstream is taken out of rotation for health_hold_s even "
        "though its /health still answers: a server that takes requests and never answers holds every permit.",
    )
    health_hold_s: float = Field(
        30.0,
        ge=0,
        description="How long an upstream taken out for timeouts stays out before the health poll may bring it back.",
    )


class ModelKnobs(BaseModel):
    """The model names clients may ask for beside those the upstreams list (docs/gateway.md, "Model names")."""

    model_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="Client model names and the served name each stands for, as a JSON object "
        '(`{"gpt-4o-mini": "qwen3-8b"}`; TOML: a [model_aliases] table). The served name is what goes upstream '
        "and what metrics label; /v1/models lists each alias. An alias may name another alias; a cycle is refused.",
    )
    default_model: str | None = Field(
        None,
        description="The served name (or an alias) for requests whose model no upstream lists. Unset: such a "
        "request goes to an upstream that answers any name (llama-server serving one model), else it is a 404.",
    )


def alias_targets(aliases: dict[str, str]) -> dict[str, str]:
    """Each alias with the served name it ends at (an alias may name another alias). A cycle, or an empty
    name, is a ValueError of one line."""
    resolved: dict[str, str] = {}
    for alias in aliases:
        if not alias or not aliases[alias]:
            raise ValueError(f"model_aliases: names must not be empty ({alias!r}: {aliases[alias]!r})")
        chain = [alias]
        target = aliases[alias]
        while target in aliases:
            if target in chain:
                raise ValueError(f"model_aliases: a cycle of aliases: {' -> '.join([*chain, target])}")
            chain.append(target)
            target = aliases[target]
        resolved[alias] = target
    return resolved


class TimeoutKnobs(BaseModel):
    """How long each part of an upstream request may take before it is aborted."""

    connect_timeout_s: float = Field(
        5.0, gt=0, description="TCP connect timeout to an upstream (a loopback or LAN connect takes milliseconds)."
    )
    upstream_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Longest a non-streamed upstream request may take, generation included: its answer begins "
        "only when its generation ends, so this is also how long it may wait for that answer. A stream has no "
        "total bound (first_token_timeout_s, then stream_idle_timeout_s): it runs as long as it produces.",
    )
    first_token_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Longest a streamed request may wait for its first token once admitted (the upstream's queue "
        "and prefill; headers included): past it the upstream request is aborted, the client gets 504 (or an "
        "error event, if the stream had begun). Under the controller the backend's own queue stays short, so "
        "two minutes means a hung server, not a busy one.",
    )
    stream_idle_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest silence between two reads of a streamed answer, from its first token on (before it, "
        "first_token_timeout_s): past it the upstream request is aborted and the client gets an error event, at the "
        "latest 1.25 times this after the last byte (the silence is looked at, not timed per read). A decoding "
        "server sends a token every few to few hundred ms.",
    )


class ClientKnobs(BaseModel):
    """Who may call the gateway, and what a request may reach and ask for."""

    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Accepted client API keys (Authorization: Bearer). Empty: no auth."
    )
    admin_api_key: str | None = Field(
        None,
        description="Bearer token that /metrics and /state require (Prometheus: `authorization: {credentials: "
        "...}` in its scrape config). Unset: they are open, as the health routes are.",
    )
    passthrough_paths: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Extra upstream paths clients may reach through the gateway as they are, without a permit "
        "(e.g. /v1/audio/transcriptions). Empty: none, so no admin route of a backend is exposed by accident.",
    )
    max_n: int = Field(
        16, ge=1, description="Largest `n` (choices per request) accepted; each choice is a generation upstream."
    )
    max_request_sequences: int = Field(
        16,
        ge=1,
        description="The most sequences one request may run at once: `n` answers to each prompt of a completions "
        "`prompt` list. Each holds a slot of its upstream's limit (and of the backend's batch and KV cache); a "
        "request wider than this, or than its upstream's limit could ever be, is refused with a 400 that says so.",
    )


class TenantKnobs(BaseModel):
    """Who shares the slots, and in what order and proportion queued requests are admitted."""

    tenants: list[TenantConfig] = Field(
        default_factory=list,
        description="The tenants, identified by their API keys (TOML: [[tenants]] tables). Requests with none of "
        "their keys (api_keys, or no keys at all) belong to the tenant `default`, which may be configured too.",
    )
    tenant_header: str | None = Field(
        None,
        description="On a trusted network without client keys: a request header naming the tenant. Names "
        "without an entry in `tenants` get the default tenant's settings, a queue of their own, and share one "
        "metrics label (`other`).",
    )
    priority_classes: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["interactive", "standard", "batch"],
        description="Priority classes, highest first. A higher class is admitted first; see "
        "starvation_after for what the lower ones still get.",
    )
    default_priority: str = Field("standard", description="Class of a tenant that names none.")
    priority_header: str = Field(
        "x-sweetspot-priority",
        description="Request header naming the priority class a request asks for (one of priority_classes); "
        "a tenant gets at most its max_priority, whatever it asks.",
    )
    starvation_after: int = Field(
        20,
        ge=0,
        description="Anti-starvation: a lower class with requests waiting that was passed over this many "
        "admissions in a row gets the next one (so at least 1 in starvation_after + 1). 0: strict priority.",
    )
    queue_discipline: Literal["fair", "fifo"] = Field(
        "fair",
        description="Inside a priority class: `fair` shares the slots between tenants by weight (per-tenant "
        "queues, start-time fair queuing); `fifo` admits by arrival, whoever sent it.",
    )
    tenant_reserve: float = Field(
        0.1,
        ge=0,
        le=1,
        description="With `fair`: the top slots of each upstream's limit (this share of it, at least one, never "
        "all) go only to a tenant holding fewer than half its weighted share, while such a tenant has requests "
        "running; a light tenant's next request then finds a free slot instead of waiting for a release, which "
        "comes at random when the limit is full (docs/tenants.md measures the wait). The limit is never exceeded. "
        "0: every slot is anyone's.",
    )


class AdmissionKnobs(BaseModel):
    """The permits requests wait for, and how many may wait, for how long."""

    initial_limit: int = Field(
        8, ge=1, description="Concurrency limit per upstream at start (or always, with the controller off)."
    )
    max_queue: int = Field(
        1024, ge=0, description="Requests allowed to wait for a permit; beyond it the gateway answers 429."
    )
    max_queued_bytes: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="Bytes of request bodies the gateway may hold before their requests run: those waiting for a "
        "permit and those still arriving, all connections together; beyond it the gateway answers 429 with "
        "Retry-After. Bounds the queue's memory where max_queue counts requests.",
    )
    queue_timeout_s: float = Field(
        60.0, gt=0, description="Longest a request may wait in the queue before a 503 with Retry-After."
    )


class RoutingKnobs(BaseModel):
    """Which upstream a request goes to when several serve its model."""

    routing: Literal["prefix", "least_loaded", "random"] = Field(
        "prefix",
        description="How a request picks among several upstreams that serve its model and have room: `prefix` "
        "prefers the one that recently served the longest prefix of its prompt (its prefix cache skips that "
        "prefill), weighed against load; `least_loaded` takes the most free permits; `random` any with room (a "
        "baseline for benchmarks). With one upstream there is nothing to choose. docs/gateway.md says why.",
    )
    routing_load_weight: float = Field(
        1.0,
        ge=0,
        description="Prefix routing's price of load: an upstream's score is the share of the prompt it holds minus "
        "this times its in-flight/limit. 0: affinity always wins among upstreams with room.",
    )
    routing_prefix_map_max: int = Field(
        200_000,
        ge=1,
        description="Prompt-prefix chunks (256 characters each) remembered with the upstreams that served them; "
        "the least recently used are forgotten first. About 250 bytes each.",
    )
    routing_prefix_ttl_s: float = Field(
        600.0,
        gt=0,
        description="How long a served prefix is taken to stay in an upstream's cache (backends evict under "
        "memory pressure; a stale guess only costs one cache miss).",
    )
    routing_lora_weight: float = Field(
        0.5,
        ge=0,
        description="LoRA affinity (with routing = prefix): added to the score of an upstream where the request's "
        "adapter runs (half of it where it ran recently), against load_weight x in-flight/limit. 0: adapters are "
        "placed by load alone. docs/routing.md measures it.",
    )
    routing_lora_swap_penalty: float = Field(
        1.0,
        ge=0,
        description="LoRA affinity: taken off the score of an upstream where max_lora other adapters run (vLLM's "
        "vllm:lora_requests_info and the gateway's own requests), where the request would wait for one to drain.",
    )
    response_affinity_max: int = Field(
        100_000,
        ge=1,
        description="Responses API ids remembered with the upstream that created them (previous_response_id, "
        "GET/cancel by id reach that upstream); the oldest are forgotten first. About 150 bytes each.",
    )
    response_affinity_ttl_s: float = Field(
        6 * 3600.0,
        gt=0,
        description="How long a response id is remembered (a backend keeps stored responses in memory, not for ever).",
    )


class ControlLoopKnobs(BaseModel):
    """Whether the limit moves, by which algorithm, how often, and where it starts."""

    control_enabled: bool = Field(True, description="Move the limit with the AIMD controller; off = static limit.")
    control_interval_s: float = Field(2.0, gt=0, description="Controller tick period.")
    algorithm: str | None = Field(
        None,
        description="Another limit algorithm in the AIMD controller's place. A built-in name, one of the schemes users "
        "run today with its reference's published defaults: `static` (holds the limit the gateway starts at: the "
        "sweep result's sweet spot, else initial_limit), `gie-threshold` (the Gateway API Inference Extension's "
        "gate), `envoy-gradient` (Envoy's adaptive concurrency filter), `netflix-gradient2`, `netflix-vegas`, "
        "`netflix-aimd` (Netflix concurrency-limits'); or `module:factory`, a callable taking no arguments that "
        "returns a gateway.control.algorithm.LimitAlgorithm (one per upstream), imported at start-up as uvicorn "
        "imports an app. It starts at its own limit and is ticked every control_interval_s (Envoy's pace is 0.1 s, "
        "GIE's 0.05 s with metrics_interval_s 0.05); the limiter, the hard cap (given to it in each observation) "
        "and limit_min/limit_max stay the gateway's. Unset: the built-in controller.",
    )
    sweep_result: Path | None = Field(
        None, description="A `sweetspot sweep` JSON result: the controller starts at its sweet spot."
    )


class HeadroomKnobs(BaseModel):
    """Where the controller reads the backends' and GPUs' headroom, and the caps its limit never exceeds."""

    metrics_interval_s: float = Field(
        2.0, gt=0, description="How often each upstream's own /metrics (KV usage, waiting, preemptions) is scraped."
    )
    gpus: Annotated[list[int], NoDecode] = Field(
        default_factory=list,
        description="NVML indices of the GPUs whose headroom counts, e.g. 0,1. Empty: every GPU NVML sees.",
    )
    nvml_interval_s: float = Field(5.0, gt=0, description="How often GPU headroom is read from NVML.")
    backend_max_seqs: int | None = Field(
        None,
        ge=1,
        description="The backend's own cap on concurrently running requests (vLLM --max-num-seqs; llama-server's "
        "--parallel is read from /props). The hard cap on the limit never exceeds it; vLLM does not publish it, "
        "so set it for vLLM. With R gateway replicas in front of one server, keep limit_max x R within it.",
    )
    kv_capacity_tokens: int | None = Field(
        None,
        ge=1,
        description="KV-cache capacity of each upstream in tokens (e.g. from `sweetspot plan --json`), used as a "
        "hard cap (capacity / typical request size) when the backend's own metrics give none.",
    )


class ReplicaKnobs(BaseModel):
    """Gateway replicas in front of the same backends, sharing their demand and limits."""

    share_redis_url: str | None = Field(
        None,
        description="Redis URL (redis://host:6379/0) through which the gateway replicas in front of the same "
        "backends share each upstream's demand and limit, so each takes its demand-weighted share (docs/deploy.md). "
        "Without it, or while Redis is unreachable, each replica judges by the backend's metrics alone. Needs the "
        "[share] extra.",
    )
    share_ttl_s: float = Field(
        10.0,
        gt=0,
        description="A replica's shared entry older than this is ignored (and removed): a replica that stopped "
        "publishing, a pod gone, leaves the others' shares within this time.",
    )
    share_namespace: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="Prefix of the shared state's Redis keys: replicas share an upstream's demand and limit only "
        "within one namespace. Unset: a hash of the upstreams (sorted), limit_min, limit_max and max_queue, so "
        "replicas configured alike share and fleets configured differently never mix. Set it to keep apart two "
        "fleets configured alike on one Redis (staging and production; a URL such as http://vllm:8000 naming "
        "another server in each), or to keep sharing while a rollout changes the upstreams. Entries are checked "
        "on reading (docs/gateway.md, 'Shared state'): one outside limit_min..limit_max, with a demand over "
        "limit_max + max_queue, non-finite, dated ahead or under another id format is deleted and counted.",
    )


class CapacityKnobs(BaseModel):
    """The capacity signal: how many backends each model's demand needs (docs/deploy.md, "The capacity signal")."""

    target_utilisation: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Share of a backend's measured capacity (what it delivers at its limit) the capacity signal "
        "plans to use: sweetspot_upstreams_desired = ceil(demand / (target_utilisation x the pool's median "
        "capacity)). 0.8 leaves a fifth for bursts and for the minutes a new backend takes to load its model.",
    )
    scale_down_after_s: float = Field(
        300.0,
        ge=0,
        description="How long a lower figure of sweetspot_upstreams_desired must hold before the exported figure "
        "goes down (it goes up at once). 300 s: KEDA's and the HPA's own scale-down stabilisation window.",
    )


class LoggingKnobs(BaseModel):
    """What the gateway writes about itself."""

    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Least severe log record written; 'warning' drops the access log and limit changes."
    )
    log_format: Literal["json", "text"] = Field(
        "json", description="json: one JSON object per line (for log collectors); text: for a person at a terminal."
    )
    access_log: bool = Field(True, description="One log line per answered request (logger sweetspot.access).")
    event_loop_lag_interval_s: float = Field(
        0.5,
        gt=0,
        description="How often the event loop's lag is measured (sweetspot_event_loop_lag_seconds).",
    )


#: The settings' sections by title, in the order ``sweetspot serve --help`` shows them (a help panel each).
#: Every field of :class:`Settings` is declared in exactly one of them (a unit test holds it).
SECTIONS: dict[str, type[BaseModel]] = {
    "Listening and front door": ListeningKnobs,
    "Upstreams": UpstreamKnobs,
    "Model names": ModelKnobs,
    "Upstream timeouts": TimeoutKnobs,
    "Clients and keys": ClientKnobs,
    "Tenants and priorities": TenantKnobs,
    "Admission and queue": AdmissionKnobs,
    "Routing": RoutingKnobs,
    "Control loop": ControlLoopKnobs,
    "Controller: limits, objectives, the knee search": ControllerKnobs,
    "Headroom and hard caps": HeadroomKnobs,
    "Replicas and shared state": ReplicaKnobs,
    "Capacity signal": CapacityKnobs,
    "Logging and metrics": LoggingKnobs,
}


class Settings(
    BaseSettings,
    ControllerKnobs,
    ListeningKnobs,
    UpstreamKnobs,
    ModelKnobs,
    TimeoutKnobs,
    ClientKnobs,
    TenantKnobs,
    AdmissionKnobs,
    RoutingKnobs,
    ControlLoopKnobs,
    HeadroomKnobs,
    ReplicaKnobs,
    CapacityKnobs,
    LoggingKnobs,
):
    """The gateway's configuration: every section's fields (:data:`SECTIONS`), and the checks that span
    them. Field docs are the reference; ``sweetspot serve --help`` shows them. The controller's knobs
    (limits, objectives, the knee search) come from :class:`~gateway.control.config.ControllerKnobs`,
    where each is declared once."""

    model_config = SettingsConfigDict(env_prefix="SWEETSPOT_", extra="ignore", validate_default=True)

    @field_validator("upstreams", "api_keys", "gpus", "passthrough_paths", "priority_classes", mode="before")
    @classmethod
    def _csv(cls, value: Any) -> Any:
        return _split_csv(value)

    @field_validator("upstreams")
    @classmethod
    def _check_upstreams(cls, value: list[str]) -> list[str]:
        """Each a base URL or a dns+ name, without a trailing ``/``: a bad one is one line at start-up (exit 2)."""
        from gateway.server.upstream.discovery import check_upstream

        return [check_upstream(url) for url in value]

    @field_validator("discovery_nameserver")
    @classmethod
    def _check_nameserver(cls, value: str | None) -> str | None:
        from gateway.server.upstream.dns_discovery import parse_nameserver

        if value is not None:
            parse_nameserver(value)
        return value

    @field_validator("algorithm")
    @classmethod
    def _algorithm_form(cls, value: str | None) -> str | None:
        """A built-in name, or the form of an import path; whether the path imports is checked when the server
        starts (gateway.server.feedback.algorithm_path)."""
        if value is None:
            return None
        if value.strip() in BUILT_IN:
            return value.strip()
        module, sep, attribute = value.strip().partition(":")
        if (
            not sep
            or not module
            or not attribute
            or ":" in attribute
            or not all(part.isidentifier() for part in (*module.split("."), *attribute.split(".")))
        ):
            raise ValueError(
                f"{value!r} is neither a built-in algorithm ({', '.join(BUILT_IN)}) nor of the form "
                "'module:factory' (e.g. 'mypackage.limits:MyLimit')"
            )
        return value.strip()

    @model_validator(mode="after")
    def _check_algorithm_runs(self) -> Settings:
        if self.algorithm is not None and not self.control_enabled:
            raise ValueError(
                f"algorithm {self.algorithm!r} needs the control loop, which control_enabled=false "
                "turns off (a static limit)"
            )
        return self

    @model_validator(mode="after")
    def _check_models(self) -> Settings:
        """A cycle of aliases, or an empty name, cannot mean anything: one line at start-up (exit 2). A served
        name no upstream lists is only known once they are polled: a warning then (it may be loaded later)."""
        alias_targets(self.model_aliases)
        if self.default_model is not None and not self.default_model.strip():
            raise ValueError("default_model must not be empty (unset it instead)")
        return self

    @model_validator(mode="after")
    def _check_tenants(self) -> Settings:
        """Refuse a tenant table that cannot mean one thing: each error is one line at start-up (exit 2)."""
        classes = self.priority_classes
        if not classes or len(set(classes)) != len(classes):
            raise ValueError(f"priority_classes must be distinct names, got {classes}")
        if self.default_priority not in classes:
            raise ValueError(f"default_priority {self.default_priority!r} is not one of priority_classes {classes}")
        names: set[str] = set()
        owners: dict[str, str] = {key: "api_keys" for key in self.api_keys}
        if len(owners) != len(self.api_keys):
            raise ValueError("api_keys lists a key twice")
        for tenant in self.tenants:
            where = f"tenant {tenant.name!r}"
            if tenant.name in names:
                raise ValueError(f"{where} is configured twice")
            if tenant.name == OTHER_TENANTS:
                raise ValueError(f"{where}: the name is reserved for the tenants without an entry of their own")
            names.add(tenant.name)
            if not tenant.weight > 0:
                raise ValueError(f"{where}: weight must be > 0, got {tenant.weight:g}")
            for field_name in ("priority", "max_priority"):
                value = getattr(tenant, field_name)
                if value is not None and value not in classes:
                    raise ValueError(f"{where}: {field_name} {value!r} is not one of priority_classes {classes}")
            own = classes.index(tenant.priority or self.default_priority)
            if tenant.max_priority is not None and classes.index(tenant.max_priority) > own:
                raise ValueError(f"{where}: max_priority {tenant.max_priority!r} is below its priority")
            for key in tenant.api_keys:
                if key in owners:
                    raise ValueError(f"{where}: its key is already {owners[key]}'s (keys must be unique)")
                owners[key] = where
        if self.tenant_header is not None and owners:
            raise ValueError("tenant_header names tenants only without client keys (api_keys, tenants' api_keys)")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = _TOML_FILE.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: A flag's value that sets an optional setting to None (``--ttft-p99-slo-s none``), over env and TOML:
#: among :func:`load_settings`' flags, None means "not given".
UNSET: Final = _Unset()


def load_settings(config: Path | None = None, **flags: Any) -> Settings:
    """Build the settings from flags (``None`` values mean "not given", :data:`UNSET` sets None), env and
    an optional TOML file."""
    import os

    if config is None and os.environ.get("SWEETSPOT_CONFIG"):
        config = Path(os.environ["SWEETSPOT_CONFIG"])
    if config is not None and not config.is_file():
        raise FileNotFoundError(f"config file not found: {config}")
    token = _TOML_FILE.set(config)
    try:
        given = {key: None if value is UNSET else value for key, value in flags.items() if value is not None}
        return Settings(**given)
    finally:
        _TOML_FILE.reset(token)
