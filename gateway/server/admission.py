"""Admission: per-upstream limiters (in-flight permits) and the bounded priority queue in front of them.

One queue serves every upstream so a request waits once and goes to whichever eligible, healthy
upstream frees a permit first; ties go to the upstream with the most free permits. The queue knows an
upstream only as an :class:`AdmissionTarget` (a name, health, a limiter), and a :class:`Permit` carries
the target it was granted on, so whoever holds one has its upstream. The queue is
ordered by priority (higher first), FIFO within a priority. Nothing here does I/O: the clock is
injected, waiting is an ``asyncio.Future`` the caller awaits, and a caller that goes away (client
disconnect, timeout) is removed before it can reach an upstream.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar


class Limiter:
    """In-flight permits for one upstream. The limit may change at any time; lowering it below the
    current in-flight count never cancels running requests, it only stops new admissions."""

    def __init__(self, name: str, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.name = name
        self.limit = limit
        self.inflight = 0
        self._peak = 0

    @property
    def free(self) -> int:
        return max(self.limit - self.inflight, 0)

    @property
    def has_room(self) -> bool:
        return self.inflight < self.limit

    def set_limit(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit

    def acquire(self) -> None:
        self.inflight += 1
        if self.inflight > self._peak:
            self._peak = self.inflight

    def release(self) -> None:
        if self.inflight <= 0:
            raise RuntimeError(f"release without acquire on {self.name}")
        self.inflight -= 1

    def take_peak(self) -> int:
        """Highest in-flight count since the last call (at least the current one); resets the mark."""
        peak = max(self._peak, self.inflight)
        self._peak = self.inflight
        return peak


class AdmissionError(Exception):
    """A request the gateway refuses; carries what the HTTP layer needs to answer it."""

    status = 503
    reason = "rejected"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(AdmissionError):
    status = 429
    reason = "queue_full"


class QueueTimeout(AdmissionError):
    status = 503
    reason = "queue_timeout"


class NoHealthyUpstream(AdmissionError):
    status = 503
    reason = "no_upstream"


class ShuttingDown(AdmissionError):
    status = 503
    reason = "shutting_down"


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
    released: bool = False

    @property
    def limiter(self) -> Limiter:
        return self.target.limiter


@dataclass(order=True)
class _Waiter(Generic[T]):
    key: tuple[int, int]
    future: asyncio.Future[Permit[T]] = field(compare=False)
    eligible: Collection[str] | None = field(compare=False)
    enqueued: float = field(compare=False)
    gone: bool = field(default=False, compare=False)  # left the queue: admitted, timed out or cancelled
    hint: Any = field(default=None, compare=False)  # what ``choose`` knows of the request (None: most free)


class AdmissionQueue(Generic[T]):
    """Hands out permits on a set of targets (upstreams), queueing up to ``max_queue`` requests.

    ``choose`` (optional) picks among the targets that can take a request now, for requests that carry a
    ``hint`` (:mod:`gateway.server.routing`); without either, the one with the most free permits."""

    def __init__(
        self,
        targets: Collection[T],
        *,
        max_queue: int,
        clock: Callable[[], float] = time.monotonic,
        drain_horizon_s: float = 30.0,
        choose: Callable[[list[T], Any], T] | None = None,
    ) -> None:
        self.targets: dict[str, T] = {target.name: target for target in targets}
        self.max_queue = max_queue
        self._clock = clock
        self._heap: list[_Waiter[T]] = []
        self._waiting = 0  # live (not cancelled) waiters; the heap may still hold cancelled ones
        self._seq = itertools.count()
        self._releases: deque[float] = deque()  # release times within the drain horizon
        self._drain_horizon_s = drain_horizon_s
        self._closed: Callable[[], AdmissionError] | None = None
        self.choose = choose

    # --- state -----------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return self._waiting

    def depth_for(self, name: str) -> int:
        """Queued requests that ``name`` could serve: the demand this upstream's limit holds back."""
        if len(self.targets) == 1:
            return self._waiting
        return sum(1 for w in self._heap if not w.gone and (w.eligible is None or name in w.eligible))

    def _forget_releases(self, now: float) -> None:
        cutoff = now - self._drain_horizon_s
        while self._releases and self._releases[0] < cutoff:
            self._releases.popleft()

    def drain_rate(self) -> float:
        """Permits released per second over the recent past: how fast the queue moves."""
        now = self._clock()
        self._forget_releases(now)
        if not self._releases:
            return 0.0
        span = max(now - self._releases[0], 1.0)
        return len(self._releases) / span

    def retry_after(self, ahead: int | None = None) -> int:
        """Seconds until a request joining behind ``ahead`` others would likely be admitted (1..60)."""
        ahead = self._waiting if ahead is None else ahead
        rate = self.drain_rate()
        if rate <= 0:
            return 5
        return int(min(max(math.ceil((ahead + 1) / rate), 1), 60))

    def _candidates(self, eligible: Collection[str] | None) -> list[T]:
        if eligible is None:
            return list(self.targets.values())
        return [self.targets[name] for name in eligible if name in self.targets]

    def _best(self, eligible: Collection[str] | None, hint: Any = None) -> T | None:
        if hint is not None and self.choose is not None:
            available = [target for target in self._candidates(eligible) if _available(target)]
            return self.choose(available, hint) if available else None
        best: T | None = None
        for target in self._candidates(eligible):
            if _available(target) and (best is None or target.limiter.free > best.limiter.free):
                best = target
        return best

    def _grant(self, target: T) -> Permit[T]:
        target.limiter.acquire()
        return Permit(target, self._clock())

    # --- acquiring -------------------------------------------------------------------------------
    async def acquire(
        self, *, priority: int = 0, eligible: Collection[str] | None = None, timeout_s: float, hint: Any = None
    ) -> Permit[T]:
        """Wait for a permit on one of the ``eligible`` upstreams (all when None).

        Raises :class:`NoHealthyUpstream` at once when none of them is healthy, :class:`QueueFull`
        when the queue is at ``max_queue``, :class:`QueueTimeout` after ``timeout_s``. If the caller
        is cancelled (its client went away) it leaves the queue and never holds a permit.
        """
        if self._closed is not None:
            raise self._closed()
        candidates = self._candidates(eligible)
        if not any(target.healthy for target in candidates):
            raise NoHealthyUpstream("no healthy upstream serves this request", retry_after_s=2)
        if self._waiting == 0:
            target = self._best(eligible, hint)
            if target is not None:
                return self._grant(target)
        if self._waiting >= self.max_queue:
            raise QueueFull(
                f"the gateway's queue is full ({self.max_queue} waiting)", retry_after_s=self.retry_after()
            )
        loop = asyncio.get_running_loop()
        waiter: _Waiter[T] = _Waiter((-priority, next(self._seq)), loop.create_future(), eligible, self._clock(),
                                     hint=hint)
        heapq.heappush(self._heap, waiter)
        self._waiting += 1
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
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
            future.cancel()
            self._waiting -= 1
            self._compact()

    def _compact(self) -> None:
        """Drop the heap's dead entries once they outnumber the live ones, so requests that left the queue
        (timed out, hung up) never pile up behind a head that cannot be admitted."""
        if len(self._heap) > 2 * self._waiting + 64:
            self._heap = [waiter for waiter in self._heap if not waiter.gone]
            heapq.heapify(self._heap)

    def close(self, error: Callable[[], AdmissionError]) -> None:
        """Refuse every queued request and every later one with ``error()`` (the gateway is draining)."""
        self._closed = error
        for waiter in self._heap:
            if not waiter.gone:
                waiter.gone = True
                waiter.future.set_exception(error())
        self._heap.clear()
        self._waiting = 0

    def release(self, permit: Permit[T]) -> None:
        """Return a permit (idempotent) and admit whoever can now run."""
        if permit.released:
            return
        permit.released = True
        permit.limiter.release()
        now = self._clock()
        self._releases.append(now)
        self._forget_releases(now)
        self.dispatch()

    def dispatch(self) -> None:
        """Admit queued requests while some eligible upstream has a free permit.

        Call it after anything that frees capacity: a release, a raised limit, an upstream turning
        healthy. Waiters are taken in priority order; a waiter whose upstreams are all busy does not
        block the ones behind it that can go elsewhere.
        """
        if not self._waiting:
            return
        skipped: list[_Waiter[T]] = []
        while self._heap:
            waiter = heapq.heappop(self._heap)
            if waiter.gone:
                continue
            target = self._best(waiter.eligible, waiter.hint)
            if target is None:
                skipped.append(waiter)
                if not any(_available(t) for t in self.targets.values()):
                    break
                continue
            self._waiting -= 1
            waiter.gone = True
            waiter.future.set_result(self._grant(target))
        for waiter in skipped:
            heapq.heappush(self._heap, waiter)

    def try_acquire(self, eligible: Collection[str]) -> Permit[T] | None:
        """A permit right now on one of ``eligible`` or None; used to fail over without queueing."""
        target = self._best(eligible)
        return None if target is None else self._grant(target)
