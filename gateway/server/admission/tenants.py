"""Tenants: who a request belongs to, and what that tenant may have (share, class, caps, quota).

A tenant is a credential, never a header a client sets freely: with client keys configured, the key a
request carries names its tenant (compared as bytes in constant time, every key checked). Only a
deployment without keys may name tenants by a configured header (a trusted network), and a name without
an entry of its own gets the default tenant's settings, a queue of its own and the shared metrics label,
so the label set stays bounded whatever clients send. Everything else is the one tenant ``default``.

The admission queue keeps each tenant's running and queued counts here, so a cap is one comparison on
the request path; the output-token quota is a bucket charged when a request ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.server.admission.keys import KeyRing
from gateway.server.admission.retry_after import ReleaseRate
from gateway.settings import OTHER_TENANTS, Settings, TenantConfig

if TYPE_CHECKING:
    from gateway.telemetry.metrics import TenantMeters

DEFAULT_TENANT = "default"
#: Header-named tenants kept at once; past it the idle ones are forgotten, and if none is idle, new names
#: share one tenant (``other``): a client sending random names cannot grow the gateway's memory.
MAX_NAMED_TENANTS = 1024


class TokenBucket:
    """An output-token quota: ``per_minute`` tokens, refilled continuously at ``per_minute / 60`` a second
    and never above ``per_minute`` (an idle tenant banks at most a minute's worth). A finished request's
    output tokens are taken out even when that takes the bucket below zero (a generation is never cut);
    while it is at or below zero new requests are refused until it is positive again."""

    __slots__ = ("capacity", "level", "rate", "stamp")

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = self.capacity
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def spend(self, tokens: int, now: float) -> None:
        self._refill(now)
        self.level -= tokens

    def retry_after(self, now: float) -> int | None:
        """None while there is quota left; else whole seconds until the bucket is positive again."""
        self._refill(now)
        if self.level > 0:
            return None
        return math.floor(-self.level / self.rate) + 1  # whole seconds, rounded so that it is then positive


@dataclass(eq=False)
class Tenant:
    """One tenant at run time. Classes are indices into ``priority_classes``: 0 is the highest."""

    name: str
    label: str = OTHER_TENANTS
    weight: float = 1.0
    priority: int = 0
    max_priority: int = 0
    max_inflight: int | None = None
    max_queued: int | None = None
    quota: TokenBucket | None = None
    meters: TenantMeters | None = None
    inflight: int = 0
    queued: int = 0
    releases: ReleaseRate = field(default_factory=ReleaseRate, repr=False)

    def may_run(self) -> bool:
        return self.max_inflight is None or self.inflight < self.max_inflight

    def class_for(self, asked: int | None) -> int:
        """The class a request runs in: its own unless it asks for another, and never above max_priority."""
        return self.priority if asked is None else max(asked, self.max_priority)

    def released(self, now: float) -> None:
        self.inflight -= 1
        self.releases.add(now)

    def retry_after(self, now: float) -> int:
        """Seconds until a request joining this tenant's queue now would likely run (1..60), from the rate
        its own requests finished at lately: another tenant's traffic says nothing about this one's turn."""
        return self.releases.retry_after(self.queued, now)

    # --- metrics (no-ops for a tenant built without them, as in unit tests) ------------------------
    def count_request(self) -> None:
        if self.meters is not None:
            self.meters.requests.inc()

    def count_rejection(self, reason: str) -> None:
        if self.meters is not None:
            self.meters.rejected(reason)

    def count_wait(self, seconds: float) -> None:
        if self.meters is not None:
            self.meters.queue_wait.observe(seconds)

    def spend(self, output_tokens: int, now: float) -> None:
        """A request of this tenant ended with ``output_tokens`` (from the upstream's usage)."""
        if output_tokens <= 0:
            return
        if self.quota is not None:
            self.quota.spend(output_tokens, now)
        if self.meters is not None:
            self.meters.output_tokens.inc(output_tokens)


class TenantDirectory:
    """The tenants of one gateway, built from the settings, and who a request is."""

    def __init__(
        self, settings: Settings, *, clock: Callable[[], float], meters: Callable[[str], TenantMeters] | None = None
    ) -> None:
        self.classes = list(settings.priority_classes)
        self._clock = clock
        self._meters = meters
        configs = {config.name: config for config in settings.tenants}
        base = configs.get(DEFAULT_TENANT, TenantConfig(name=DEFAULT_TENANT))
        self._base = base.model_copy(update={"api_keys": []})
        self._default_class = settings.default_priority
        self.default = self._build(base, DEFAULT_TENANT)
        self.configured: dict[str, Tenant] = {DEFAULT_TENANT: self.default}
        for name, config in configs.items():
            if name != DEFAULT_TENANT:
                self.configured[name] = self._build(config, name)
        self._keys = KeyRing(
            [(key, self.default) for key in settings.api_keys]
            + [(key, self.configured[config.name]) for config in settings.tenants for key in config.api_keys]
        )
        #: Keys are configured: every route needs one, and the client's own credential never goes upstream.
        self.requires_key = bool(self._keys)
        self.header = settings.tenant_header.lower().encode("latin-1") if settings.tenant_header else None
        self._named: dict[str, Tenant] = {}
        self._overflow: Tenant | None = None

    def _build(self, config: TenantConfig, label: str) -> Tenant:
        priority = self.classes.index(config.priority or self._default_class)
        highest = priority if config.max_priority is None else self.classes.index(config.max_priority)
        quota = config.output_tokens_per_minute
        return Tenant(
            name=config.name,
            label=label,
            weight=config.weight,
            priority=priority,
            max_priority=highest,
            max_inflight=config.max_inflight,
            max_queued=config.max_queued,
            quota=TokenBucket(quota, self._clock()) if quota else None,
            meters=self._meters(label) if self._meters is not None else None,
        )

    def identify(
        self, authorization: bytes | None, api_key: bytes | None = None, *, named: bytes | None = None
    ) -> Tenant | None:
        """The tenant of a request with these ``Authorization`` and ``x-api-key`` values and the tenant
        header's value ``named``; None when keys are required and none matches (401)."""
        if self.requires_key:
            return self._keys.find(authorization, api_key)
        if named is None or self.header is None:
            return self.default
        return self.by_name(named.decode("latin-1"))

    def authorized(self, authorization: bytes | None, api_key: bytes | None) -> bool:
        """Whether a request that names no tenant may pass (the light routes, the model list)."""
        return not self.requires_key or self._keys.find(authorization, api_key) is not None

    def by_name(self, name: str) -> Tenant:
        """A header-named tenant: a configured one, else one built from the default's settings."""
        tenant = self.configured.get(name)
        if tenant is not None:
            return tenant
        tenant = self._named.get(name)
        if tenant is not None:
            return tenant
        if len(self._named) >= MAX_NAMED_TENANTS:
            self._named = {key: t for key, t in self._named.items() if t.inflight or t.queued}
        if len(self._named) >= MAX_NAMED_TENANTS:
            if self._overflow is None:
                self._overflow = self._build(self._base.model_copy(update={"name": OTHER_TENANTS}), OTHER_TENANTS)
            return self._overflow
        tenant = self._named[name] = self._build(self._base.model_copy(update={"name": name}), OTHER_TENANTS)
        return tenant

    def asked_class(self, tenant: Tenant, raw: str) -> int:
        """The class of a request whose priority header says ``raw``: a class's name, or an integer whose sign
        asks for the class above (> 0) or below (< 0) the tenant's own; never above its ``max_priority``
        (ValueError for anything else)."""
        value = raw.strip()
        if value in self.classes:
            return tenant.class_for(self.classes.index(value))
        try:
            step = int(value)
        except ValueError:
            raise ValueError(f"unknown priority class {value!r}; one of {self.classes}") from None
        own = tenant.priority
        asked = own - 1 if step > 0 else own + 1 if step < 0 else own
        return tenant.class_for(min(max(asked, 0), len(self.classes) - 1))

    def __iter__(self) -> Iterator[Tenant]:
        yield from self.configured.values()
        yield from self._named.values()
        if self._overflow is not None:
            yield self._overflow

    def labels(self) -> list[str]:
        return [*self.configured, OTHER_TENANTS]
