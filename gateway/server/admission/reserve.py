"""The top slots of an upstream's limit, kept for a tenant well under its share while it has requests running.

Why: with every slot busy, a request waits for the next release, and releases come at random (a generation
ends when it ends): at the usual sweet spots their gaps alone make a p99 wait of about a second, whatever the
order of the queue. A tenant with a few clients going back and forth would pay that on nearly every request,
because each of its releases is refilled at once by a backlogged tenant before its client sends again.

So the last ``max(1, fraction x limit)`` slots (never the whole limit) go only to a tenant holding fewer than
half its weighted share of the limit, or to anyone when no such tenant of the same or a higher class has
requests running with nothing queued. A light tenant's next request then finds a free slot; a backlogged
tenant waits for the next release instead. The limit itself is never exceeded: the controller's limit and the
backend's hard cap hold. The price is the reserved slots standing idle while a light tenant does not use them,
and only while one has requests running (a tenant with nothing running or queued holds nothing back); with a
single tenant, or tenants all at their share, every slot is anyone's.

Pure and synchronous: the gateway's admission queue and the scenario harness run the same rule.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol


class Holder(Hashable, Protocol):
    """A tenant as the rule sees it: its weight, class (0 the highest) and counts."""

    @property
    def weight(self) -> float: ...

    @property
    def priority(self) -> int: ...

    @property
    def inflight(self) -> int: ...

    @property
    def queued(self) -> int: ...


class Reserve:
    """The tenants with requests queued or running, their summed weight, and who may take a reserved slot.

    Call :meth:`join` before a tenant's count goes up and :meth:`settle` after one went down."""

    def __init__(self, fraction: float) -> None:
        if not 0 <= fraction <= 1:
            raise ValueError("the reserve is a fraction of the limit, 0..1")
        self.fraction = fraction
        self.active: dict[Holder, None] = {}  # insertion-ordered set
        self.weight = 0.0

    def join(self, tenant: Holder) -> None:
        if tenant not in self.active:
            self.active[tenant] = None
            self.weight += tenant.weight

    def settle(self, tenant: Holder) -> None:
        if not (tenant.inflight or tenant.queued) and tenant in self.active:
            del self.active[tenant]
            self.weight = max(self.weight - tenant.weight, 0.0) if self.active else 0.0

    def held(self, limit: int) -> int:
        """Slots at the top of ``limit`` that the rule applies to."""
        if self.fraction <= 0:
            return 0
        return min(max(1, int(limit * self.fraction)), limit - 1)

    def may_take(self, tenant: Holder, *, inflight: int, limit: int) -> bool:
        """Whether ``tenant`` may have one more request running on an upstream at ``inflight`` of ``limit``."""
        if inflight >= limit:
            return False
        if inflight < limit - self.held(limit):
            return True
        weight = self.weight if tenant in self.active else self.weight + tenant.weight
        half_share = limit / weight / 2  # per unit of weight
        if tenant.inflight < tenant.weight * half_share:
            return True
        for other in self.active:
            if (
                other is not tenant
                and not other.queued
                and other.priority <= tenant.priority
                and other.inflight < other.weight * half_share
            ):
                return False
        return True
