"""Admission: the bounded, tenant-fair queue in front of the upstreams' limiters.

One queue serves every upstream so a request waits once and goes to whichever eligible, healthy
upstream frees a permit first; ties go to the upstream with the most free permits. The queue knows an
upstream only as an :class:`AdmissionTarget` (a name, health, a :mod:`~gateway.server.admission.limiter`),
and a :class:`Permit` carries the target it was granted on and the tenant it counts against, so whoever
holds one has both. Who goes next is :mod:`gateway.server.admission.fair_queue`'s choice (priority classes,
weighted shares between tenants inside a class), and which upstream, ``choose``'s
(:mod:`gateway.server.admission.routing`) or the one with the most free permits; this module adds the bounds:
an upstream's limit (with its top slots kept for light tenants, :mod:`gateway.server.admission.reserve`),
``max_queue`` in total, each tenant's ``max_queued`` (429 with its own Retry-After), in-flight cap and
output-token quota, and refuses with one of :mod:`gateway.server.admission.refusals`. Nothing here does I/O:
the clock is injected, waiting is an ``asyncio.Future`` the caller awaits, and a caller that goes away (client
disconnect, timeout) is removed before it can reach an upstream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from gateway.control.window import RequestSample
from gateway.server.admission.fair_queue import Discipline, FairQueue
from gateway.server.admission.limiter import Limiter
from gateway.server.admission.refusals import (
    AdmissionError,
    NoHealthyUpstream,
    QueueBytesFull,
    QueueFull,
    QueueTimeout,
    QuotaExceeded,
    TenantQueueFull,
)
from gateway.server.admission.reserve import Reserve
from gateway.server.admission.retry_after import DRAIN_HORIZON_S, ReleaseRate
from gateway.server.admission.tenants import Tenant


class AdmissionTarget(Protocol):
    """What the queue admits onto: an upstream, as far as admission cares."""

    @property
    def name(self) -> str: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def limiter(self) -> Limiter: ...


T = TypeVar("T", bound=AdmissionTarget)


def _available(target: AdmissionTarget) -> bool:
    return target.healthy and target.limiter.has_room


@dataclass(eq=False)
class Permit(Generic[T]):
    """Held while a request runs on ``target``; release it exactly once through the queue."""

    target: T
    admitted: float
    tenant: Tenant
    inflight_at_grant: int = 0  # the limiter's in-flight count just after this permit was granted
    released: bool = False
    slots: int = 1  # sequences the request runs (n x prompts): slots of the limit it holds
    routed: Any = None  # the hint ``choose`` placed it by, handed back to ``routed_release`` (None: not chosen so)

    @property
    def limiter(self) -> Limiter:
        return self.target.limiter


@dataclass(eq=False, slots=True)
class _Waiter(Generic[T]):
    future: asyncio.Future[Permit[T]]
    eligible: Collection[str] | None
    tenant: Tenant
    cls: int
    hint: Any = None  # what ``choose`` knows of the request (None: the upstream with the most free permits)
    slots: int = 1  # sequences the request runs: slots it needs free on one upstream
    nbytes: int = 0  # the request's body, held while it waits (the queue's byte budget)
    gone: bool = False  # left the queue: admitted, timed out or cancelled


class AdmissionQueue(Generic[T]):
    """Hands out permits on a set of targets (upstreams), queueing up to ``max_queue`` requests.

    ``classes`` is the number of priority classes (0 is the highest); a request without a tenant counts
    against :attr:`default_tenant`. ``choose`` (optional) picks among the targets that can take a request
    now, for requests that carry a ``hint``; without either, the one with the most free permits.
    ``reserve`` is the share of each limit kept for light tenants (:class:`~gateway.server.admission.reserve.Reserve`;
    ``fair`` only). ``routed_release`` (optional) hears of every permit ``choose`` placed when it is released, with
    the hint it was placed by, so a router can keep count of what runs where."""

    def __init__(
        self,
        targets: Collection[T],
        *,
        max_queue: int,
        max_queued_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        drain_horizon_s: float = DRAIN_HORIZON_S,
        classes: int = 1,
        discipline: Discipline = "fair",
        starvation_after: int = 20,
        default_tenant: Tenant | None = None,
        reserve: float = 0.0,
        choose: Callable[[list[T], Any], T] | None = None,
        routed_release: Callable[[T, Any], None] | None = None,
    ) -> None:
        self.targets: dict[str, T] = {target.name: target for target in targets}
        self.max_queue = max_queue
        self.max_queued_bytes = max_queued_bytes
        self.queued_bytes = 0  # bodies of the requests waiting now
        self.receiving_bytes = 0  # bodies still arriving (read_body holds them here until it has them whole)
        self._clock = clock
        self._queue: FairQueue[_Waiter[T]] = FairQueue(
            classes, discipline=discipline, starvation_after=starvation_after
        )
        self._releases = ReleaseRate(drain_horizon_s)
        #: Upstreams held for a wide request waiting for room (:meth:`_hold_for`), as of the last dispatch.
        self._held: set[str] = set()
        self._closed: Callable[[], AdmissionError] | None = None
        self.default_tenant = default_tenant if default_tenant is not None else Tenant("default")
        self.reserve = Reserve(reserve if discipline == "fair" else 0.0)
        self.choose = choose
        self.routed_release = routed_release

    # --- state -----------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self._queue)

    def depth_for(self, name: str) -> int:
        """Queued requests that ``name`` could serve: the demand this upstream's limit holds back."""
        if len(self.targets) == 1:
            return len(self._queue)
        return sum(1 for w in self._queue if w.eligible is None or name in w.eligible)

    def depth_among(self, names: Collection[str]) -> int:
        """Queued requests any of ``names`` could serve (each counted once): the demand waiting for them."""
        if set(self.targets) <= set(names):
            return len(self._queue)
        return sum(1 for w in self._queue if w.eligible is None or any(name in w.eligible for name in names))

    def class_depth(self, cls: int) -> int:
        return self._queue.depth(cls)

    def drain_rate(self) -> float:
        """Permits released per second over the recent past: how fast the queue moves."""
        return self._releases.per_second(self._clock())

    def hold_receiving(self, nbytes: int) -> bool:
        """A body being received grows by ``nbytes``: held against ``max_queued_bytes`` beside the waiting
        bodies, so bodies in flight on many connections at once are bounded too. False (nothing held) when
        they would not fit."""
        limit = self.max_queued_bytes
        if limit is not None and self.queued_bytes + self.receiving_bytes + nbytes > limit:
            return False
        self.receiving_bytes += nbytes
        return True

    def release_receiving(self, nbytes: int) -> None:
        """A body is whole (or refused): the bytes :meth:`hold_receiving` held for it are given back."""
        self.receiving_bytes -= nbytes

    def retry_after(self, ahead: int | None = None) -> int:
        """Seconds until a request joining behind ``ahead`` others would likely be admitted (1..60)."""
        return self._releases.retry_after(len(self._queue) if ahead is None else ahead, self._clock())

    def _candidates(self, eligible: Collection[str] | None) -> list[T]:
        if eligible is None:
            return list(self.targets.values())
        return [self.targets[name] for name in eligible if name in self.targets]

    def _room(self, target: T, tenant: Tenant, slots: int = 1) -> bool:
        limiter = target.limiter
        return (
            target.healthy
            and target.name not in self._held
            and limiter.fits(slots)
            and self.reserve.may_take(tenant, inflight=limiter.inflight + slots - 1, limit=limiter.limit)
        )

    def _best(self, eligible: Collection[str] | None, tenant: Tenant, hint: Any = None, slots: int = 1) -> T | None:
        """The upstream a request of ``tenant`` needing ``slots`` goes to now, or None when none of
        ``eligible`` has room."""
        if hint is not None and self.choose is not None:
            available = [target for target in self._candidates(eligible) if self._room(target, tenant, slots)]
            return self.choose(available, hint) if available else None
        best: T | None = None
        for target in self._candidates(eligible):
            if self._room(target, tenant, slots) and (best is None or target.limiter.free > best.limiter.free):
                best = target
        return best

    def _may_run(self, tenant: Tenant) -> bool:
        """Whether a queued request of ``tenant`` could run somewhere now (its cap, the reserve)."""
        return tenant.may_run() and any(self._room(target, tenant) for target in self.targets.values())

    def _grant(self, target: T, tenant: Tenant, slots: int = 1, hint: Any = None) -> Permit[T]:
        """A permit on ``target``; ``hint``: the one ``choose`` placed it by (``_best`` used it when both are set)."""
        limiter = target.limiter
        limiter.acquire(slots)
        self.reserve.join(tenant)
        tenant.inflight += 1
        routed = hint if self.choose is not None else None
        return Permit(target, self._clock(), tenant, limiter.inflight, slots=slots, routed=routed)

    def _hold_for(self, waiter: _Waiter[T]) -> None:
        """A request wider than the room left waits for it, and the upstreams that could ever hold it (their
        limit is at least its width) take nobody behind it meanwhile: it is not starved by narrower ones."""
        for target in self._candidates(waiter.eligible):
            if target.healthy and target.limiter.limit >= waiter.slots:
                self._held.add(target.name)

    # --- acquiring -------------------------------------------------------------------------------
    async def acquire(
        self,
        *,
        tenant: Tenant | None = None,
        priority: int = 0,
        eligible: Collection[str] | None = None,
        timeout_s: float,
        hint: Any = None,
        slots: int = 1,
        nbytes: int = 0,
    ) -> Permit[T]:
        """Wait for a permit of ``slots`` slots on one of the ``eligible`` upstreams (all when None), in class
        ``priority``.

        Raises :class:`NoHealthyUpstream` at once when none of them is healthy, :class:`QuotaExceeded` when
        the tenant spent its output-token quota, :class:`QueueFull` when the queue is at ``max_queue``,
        :class:`TenantQueueFull` when the tenant's own queue is at its cap, :class:`QueueTimeout` after
        ``timeout_s``. If the caller is cancelled (its client went away) it leaves the queue and never holds
        a permit.
        """
        if self._closed is not None:
            raise self._closed()
        tenant = self.default_tenant if tenant is None else tenant
        candidates = self._candidates(eligible)
        if not any(target.healthy for target in candidates):
            raise NoHealthyUpstream("no healthy upstream serves this request", retry_after_s=2)
        if tenant.quota is not None:
            wait = tenant.quota.retry_after(self._clock())
            if wait is not None:
                raise QuotaExceeded(
                    f"tenant {tenant.name!r} used its output-token quota ({tenant.quota.capacity:g} per minute)",
                    retry_after_s=wait,
                )
        queue = self._queue
        # A free slot with requests queued is one none of them can take (dispatch runs whenever room appears):
        # an arrival skips nobody by taking it, unless it would pass its own tenant's queued requests.
        if not tenant.queued and tenant.may_run():
            target = self._best(eligible, tenant, hint, slots)
            if target is not None:
                return self._grant(target, tenant, slots, hint)
        if len(queue) >= self.max_queue:
            raise QueueFull(f"the gateway's queue is full ({self.max_queue} waiting)", retry_after_s=self.retry_after())
        if (
            self.max_queued_bytes is not None
            and self.queued_bytes + self.receiving_bytes + nbytes > self.max_queued_bytes
        ):
            raise QueueBytesFull(
                f"the gateway holds {self.queued_bytes + self.receiving_bytes} bytes of requests waiting or "
                f"arriving, near its {self.max_queued_bytes}",
                retry_after_s=self.retry_after(),
            )
        if tenant.max_queued is not None and tenant.queued >= tenant.max_queued:
            raise TenantQueueFull(
                f"tenant {tenant.name!r} has {tenant.queued} requests queued, its cap",
                retry_after_s=tenant.retry_after(self._clock()),
            )
        waiter: _Waiter[T] = _Waiter(
            asyncio.get_running_loop().create_future(), eligible, tenant, priority, hint, slots, nbytes
        )
        self.queued_bytes += nbytes
        queue.push(waiter, flow=tenant, weight=tenant.weight, cls=priority)
        self.reserve.join(tenant)
        tenant.queued += 1
        self.dispatch()  # work-conserving: a free slot the waiters ahead could not take is this one's
        try:
            # Not asyncio.wait_for: on Python 3.11 it returns the result when a cancellation and the permit
            # arrive together, and a request whose client had just left would go upstream with nobody to answer.
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(waiter.future)
        except BaseException as exc:
            self._abandon(waiter)
            if isinstance(exc, TimeoutError):
                raise QueueTimeout(
                    f"waited {timeout_s:g}s in the gateway's queue without a free slot",
                    retry_after_s=self.retry_after(),
                ) from None
            raise

    def _abandon(self, waiter: _Waiter[T]) -> None:
        """Take a waiter out (timed out, cancelled or refused); if a permit raced in, hand it back."""
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            self.release(future.result())
            return
        if not waiter.gone:
            waiter.gone = True
            self.queued_bytes -= waiter.nbytes
            future.cancel()
            waiter.tenant.queued -= 1
            self.reserve.settle(waiter.tenant)
            self._queue.forget(flow=waiter.tenant, cls=waiter.cls)
            if self._held:
                self.dispatch()  # it may have held upstreams for itself

    def close(self, error: Callable[[], AdmissionError]) -> None:
        """Refuse every queued request and every later one with ``error()`` (the gateway is draining)."""
        self._closed = error
        for waiter in list(self._queue):
            waiter.gone = True
            self.queued_bytes -= waiter.nbytes
            waiter.tenant.queued -= 1
            self.reserve.settle(waiter.tenant)
            waiter.future.set_exception(error())
        self._queue.clear()
        self._held.clear()

    def release(self, permit: Permit[T], sample: RequestSample | None = None) -> None:
        """Return a permit (idempotent) and admit whoever can now run. ``sample``: the request that held it,
        as it ended upstream, for the limiter's ``on_end`` (None: it never reached the upstream)."""
        if permit.released:
            return
        permit.released = True
        limiter = permit.limiter
        limiter.release(permit.slots)
        if permit.routed is not None and self.routed_release is not None:
            self.routed_release(permit.target, permit.routed)
        if sample is not None and limiter.on_end is not None:
            limiter.on_end(sample, permit.inflight_at_grant, limiter.inflight)
        now = self._clock()
        permit.tenant.released(now)
        self.reserve.settle(permit.tenant)
        self._releases.add(now)
        self.dispatch()

    def dispatch(self) -> None:
        """Admit queued requests while some eligible upstream has a free permit.

        Call it after anything that frees capacity: a release, a raised limit, an upstream turning
        healthy. Who goes first is the fair queue's choice; a waiter whose upstreams are all busy does not
        block the ones behind it that can go elsewhere, nor does a tenant at its in-flight cap. A wide waiter
        (several sequences) that does not fit yet holds the upstreams that could take it, so it is not
        starved by narrower requests behind it (:meth:`_hold_for`).
        """
        queue = self._queue
        self._held.clear()
        if not queue:
            return
        placed: list[T] = []

        def place(waiter: _Waiter[T]) -> bool:
            target = self._best(waiter.eligible, waiter.tenant, waiter.hint, waiter.slots)
            if target is None:
                if waiter.slots > 1:
                    self._hold_for(waiter)
                return False
            placed.append(target)
            return True

        targets = self.targets.values()
        while queue and any(_available(t) for t in targets):
            waiter = queue.pop(self._may_run, place)  # type: ignore[arg-type]
            if waiter is None:
                break
            waiter.gone = True
            self.queued_bytes -= waiter.nbytes
            permit = self._grant(placed.pop(), waiter.tenant, waiter.slots, waiter.hint)
            waiter.tenant.queued -= 1  # after the grant: it stays active throughout
            waiter.future.set_result(permit)

    def try_acquire(self, eligible: Collection[str], tenant: Tenant | None = None, slots: int = 1) -> Permit[T] | None:
        """A permit of ``slots`` right now on one of ``eligible`` or None; used to fail over without queueing."""
        tenant = self.default_tenant if tenant is None else tenant
        target = self._best(eligible, tenant, slots=slots)
        return None if target is None else self._grant(target, tenant, slots)
