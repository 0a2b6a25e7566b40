"""The admission queue and limiters: ordering, limits, timeouts, cancellation, Retry-After."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from gateway.server.admission.admission_queue import AdmissionQueue
from gateway.server.admission.limiter import Limiter
from gateway.server.admission.refusals import NoHealthyUpstream, QueueBytesFull, QueueFull, QueueTimeout


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Target:
    """An upstream as admission sees it."""

    name: str
    limiter: Limiter
    healthy: bool = True


def targets(**limits: int) -> list[Target]:
    return [Target(name, Limiter(name, limit)) for name, limit in limits.items()]


def make(
    limit: int = 1, max_queue: int = 10, names: tuple[str, ...] = ("a",), classes: int = 1
) -> AdmissionQueue[Target]:
    return AdmissionQueue(
        [Target(n, Limiter(n, limit)) for n in names], max_queue=max_queue, clock=FakeClock(), classes=classes
    )


async def test_admits_up_to_the_limit_then_queues_fifo() -> None:
    queue = make(limit=2)
    p1 = await queue.acquire(timeout_s=1)
    p2 = await queue.acquire(timeout_s=1)
    order: list[int] = []

    async def wait(i: int) -> None:
        permit = await queue.acquire(timeout_s=5)
        order.append(i)
        queue.release(permit)

    tasks = [asyncio.create_task(wait(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert queue.depth == 3 and queue.targets["a"].limiter.inflight == 2
    queue.release(p1)
    queue.release(p2)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    assert queue.targets["a"].limiter.inflight == 0 and queue.depth == 0


async def test_higher_class_goes_first_fifo_within_a_class() -> None:
    queue = make(limit=1, classes=3)
    held = await queue.acquire(timeout_s=1)
    order: list[str] = []

    async def wait(tag: str, priority: int) -> None:
        permit = await queue.acquire(priority=priority, timeout_s=5)
        order.append(tag)
        queue.release(permit)

    tasks = []
    for tag, prio in [("low1", 2), ("high1", 0), ("low2", 2), ("high2", 0), ("mid", 1)]:
        tasks.append(asyncio.create_task(wait(tag, prio)))
        await asyncio.sleep(0)
    queue.release(held)
    await asyncio.gather(*tasks)
    assert order == ["high1", "high2", "mid", "low1", "low2"]


async def test_full_queue_raises_429_with_retry_after() -> None:
    queue = make(limit=1, max_queue=1)
    await queue.acquire(timeout_s=1)
    waiter = asyncio.create_task(queue.acquire(timeout_s=5))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull) as info:
        await queue.acquire(timeout_s=5)
    assert info.value.status == 429 and 1 <= info.value.retry_after_s <= 60
    waiter.cancel()


async def test_timeout_leaves_the_queue_and_raises_503() -> None:
    queue = make(limit=1)
    await queue.acquire(timeout_s=1)
    with pytest.raises(QueueTimeout) as info:
        await queue.acquire(timeout_s=0.01)
    assert info.value.status == 503
    assert queue.depth == 0


async def test_cancelled_waiter_never_gets_a_permit() -> None:
    queue = make(limit=1)
    held = await queue.acquire(timeout_s=1)
    waiter = asyncio.create_task(queue.acquire(timeout_s=5))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert queue.depth == 0
    queue.release(held)
    assert queue.targets["a"].limiter.inflight == 0


async def test_a_waiter_cancelled_as_its_permit_arrives_is_cancelled_and_gives_the_permit_back() -> None:
    """Every client hangs up at once (the end of a load run): a request that held a permit ends, its permit
    goes to a waiter whose client left in the same instant. The waiter must see its cancellation, not the
    permit: a request whose client is gone must never reach the upstream (Python 3.11's ``asyncio.wait_for``
    returns the result when both arrive together, and the request ran to its end with nobody listening)."""
    queue = make(limit=1)
    held = await queue.acquire(timeout_s=1)
    waiter = asyncio.create_task(queue.acquire(timeout_s=5))
    await asyncio.sleep(0)
    queue.release(held)  # handed to the waiter at once
    waiter.cancel()  # ... whose client went away in the same instant
    [outcome] = await asyncio.gather(waiter, return_exceptions=True)
    assert isinstance(outcome, asyncio.CancelledError)
    assert queue.targets["a"].limiter.inflight == 0 and queue.depth == 0


async def test_raising_the_limit_admits_waiters_on_dispatch() -> None:
    queue = make(limit=1)
    await queue.acquire(timeout_s=1)
    waiters = [asyncio.create_task(queue.acquire(timeout_s=5)) for _ in range(2)]
    await asyncio.sleep(0)
    queue.targets["a"].limiter.set_limit(3)
    queue.dispatch()
    permits = await asyncio.gather(*waiters)
    assert len(permits) == 2 and queue.targets["a"].limiter.inflight == 3


async def test_lowering_the_limit_stops_new_admissions_only() -> None:
    queue = make(limit=3)
    permits = [await queue.acquire(timeout_s=1) for _ in range(3)]
    queue.targets["a"].limiter.set_limit(1)
    waiter = asyncio.create_task(queue.acquire(timeout_s=5))
    queue.release(permits[0])
    queue.release(permits[1])
    await asyncio.sleep(0)
    assert not waiter.done()  # still 1 in flight == the new limit
    queue.release(permits[2])
    assert (await waiter).target.name == "a"


async def test_dispatch_prefers_most_free_and_skips_unhealthy() -> None:
    queue = AdmissionQueue(targets(a=2, b=4), max_queue=5, clock=FakeClock())
    assert (await queue.acquire(timeout_s=1)).target.name == "b"
    queue.targets["b"].healthy = False
    assert (await queue.acquire(timeout_s=1)).target.name == "a"
    queue.targets["a"].healthy = False
    with pytest.raises(NoHealthyUpstream):
        await queue.acquire(timeout_s=1)


async def test_waiter_for_a_busy_upstream_does_not_block_others() -> None:
    queue = AdmissionQueue(targets(a=1, b=1), max_queue=5, clock=FakeClock())
    on_a = await queue.acquire(eligible=["a"], timeout_s=1)
    on_b = await queue.acquire(eligible=["b"], timeout_s=1)
    wants_a = asyncio.create_task(queue.acquire(eligible=["a"], timeout_s=5))
    await asyncio.sleep(0)
    wants_b = asyncio.create_task(queue.acquire(eligible=["b"], timeout_s=5))
    await asyncio.sleep(0)
    queue.release(on_b)
    assert (await wants_b).target.name == "b"
    assert not wants_a.done()
    queue.release(on_a)
    assert (await wants_a).target.name == "a"


async def test_retry_after_follows_the_drain_rate() -> None:
    clock = FakeClock()
    queue = AdmissionQueue(targets(a=1), max_queue=100, clock=clock)
    for _ in range(20):  # 20 releases over 10 s: 2 per second
        queue.release(await queue.acquire(timeout_s=1))
        clock.now += 0.5
    assert queue.drain_rate() == pytest.approx(2.0, rel=0.1)
    assert queue.retry_after(ahead=9) == 5  # (9 + 1) / 2 per second


def test_peak_inflight_resets_to_current() -> None:
    limiter = Limiter("a", 4)
    for _ in range(3):
        limiter.acquire()
    limiter.release()
    limiter.release()
    assert limiter.take_peak() == 3
    assert limiter.take_peak() == 1


async def test_requests_that_left_the_queue_do_not_pile_up_behind_a_blocked_head() -> None:
    """Waiters that time out or hang up while the head cannot be admitted are dropped on the request path,
    not only when someone reads the queue."""
    queue = make(limit=1, max_queue=100_000)
    held = await queue.acquire(timeout_s=1)
    head = asyncio.create_task(queue.acquire(timeout_s=60))
    for _ in range(20):
        gone = [asyncio.create_task(queue.acquire(timeout_s=60)) for _ in range(500)]
        await asyncio.sleep(0)
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        assert queue._queue.stored() <= 2 * queue.depth + 64 + 1  # the live head, and a bounded slack
    assert queue.depth == 1
    queue.release(held)
    assert (await head).target.name == "a"


async def test_release_times_are_kept_for_the_drain_horizon_only() -> None:
    clock = FakeClock()
    queue = AdmissionQueue(targets(a=1), max_queue=10, clock=clock)
    for _ in range(1000):
        queue.release(await queue.acquire(timeout_s=1))
        clock.now += 1.0
    assert len(queue._releases) <= 31  # 30 s of history at one release a second


async def test_a_closed_queue_refuses_the_waiting_and_the_next() -> None:
    from gateway.server.admission.refusals import ShuttingDown

    queue = make(limit=1)
    held = await queue.acquire(timeout_s=1)
    waiting = [asyncio.create_task(queue.acquire(timeout_s=10)) for _ in range(3)]
    await asyncio.sleep(0)
    queue.close(lambda: ShuttingDown("draining", retry_after_s=1))
    for task in waiting:
        with pytest.raises(ShuttingDown):
            await task
    with pytest.raises(ShuttingDown):
        await queue.acquire(timeout_s=1)
    assert queue.depth == 0
    queue.release(held)
    assert queue.targets["a"].limiter.inflight == 0


async def test_a_request_holds_one_slot_per_sequence() -> None:
    queue = make(limit=4)
    wide = await queue.acquire(timeout_s=1, slots=3)
    limiter = queue.targets["a"].limiter
    assert limiter.inflight == 3 and limiter.free == 1
    narrow = await queue.acquire(timeout_s=1)
    assert limiter.inflight == 4
    queue.release(wide)
    assert limiter.inflight == 1
    queue.release(wide)  # idempotent: the slots go back once
    queue.release(narrow)
    assert limiter.inflight == 0


async def test_a_wide_request_waits_for_its_room_and_narrower_ones_behind_it_wait_too() -> None:
    """Two narrow requests run on a limit of 4; a request of 3 sequences waits for room. A narrow request
    arriving after it would fit in the free slots, but taking them would starve the wide one: it waits
    behind it, and the wide one runs first when a slot frees."""
    queue = make(limit=4)
    limiter = queue.targets["a"].limiter
    first, second = await queue.acquire(timeout_s=1), await queue.acquire(timeout_s=1)
    order: list[str] = []

    async def run(name: str, slots: int) -> None:
        permit = await queue.acquire(timeout_s=5, slots=slots)
        order.append(name)
        await asyncio.sleep(0)
        queue.release(permit)

    wide = asyncio.create_task(run("wide", 3))
    await asyncio.sleep(0)
    late = asyncio.create_task(run("narrow", 1))
    await asyncio.sleep(0)
    assert order == [] and queue.depth == 2 and limiter.inflight == 2  # two slots free, and both wait
    queue.release(first)
    await asyncio.gather(wide, late)
    queue.release(second)
    assert order == ["wide", "narrow"] and limiter.inflight == 0


async def test_a_request_wider_than_the_limit_holds_nothing_back() -> None:
    """Wider than the limit itself: it cannot run until the limit grows, and nobody waits for it."""
    queue = make(limit=2)
    waiting = asyncio.create_task(queue.acquire(timeout_s=5, slots=3))
    await asyncio.sleep(0)
    narrow = await asyncio.wait_for(queue.acquire(timeout_s=1), 1)
    queue.release(narrow)
    queue.targets["a"].limiter.set_limit(3)
    queue.dispatch()  # as the control loop does after raising a limit
    permit = await asyncio.wait_for(waiting, 1)
    assert permit.slots == 3 and queue.targets["a"].limiter.inflight == 3
    queue.release(permit)


async def test_a_failover_takes_as_many_slots_as_the_request() -> None:
    queue = AdmissionQueue(targets(a=4, b=4), max_queue=10, clock=FakeClock())
    first = await queue.acquire(timeout_s=1, eligible=["a"], slots=2)
    other = queue.try_acquire(["b"], slots=2)
    assert other is not None and other.slots == 2 and queue.targets["b"].limiter.inflight == 2
    assert queue.try_acquire(["b"], slots=3) is None
    queue.release(first)
    queue.release(other)


async def test_queued_bodies_are_bounded_in_bytes() -> None:
    """max_queued_bytes counts the bodies waiting: past it a 429 with Retry-After, whatever max_queue allows;
    the bytes leave the budget when a waiter is admitted or gives up."""
    queue: AdmissionQueue[Target] = AdmissionQueue(
        targets(a=1), max_queue=100, max_queued_bytes=1000, clock=FakeClock()
    )
    running = await queue.acquire(timeout_s=1, nbytes=900)  # admitted at once: never queued, never counted
    assert queue.queued_bytes == 0
    first = asyncio.create_task(queue.acquire(timeout_s=5, nbytes=600))
    await asyncio.sleep(0)
    assert queue.queued_bytes == 600
    with pytest.raises(QueueBytesFull) as full:
        await queue.acquire(timeout_s=5, nbytes=500)
    assert full.value.status == 429 and full.value.retry_after_s >= 1
    small = asyncio.create_task(queue.acquire(timeout_s=5, nbytes=400))
    await asyncio.sleep(0)
    assert queue.queued_bytes == 1000
    small.cancel()
    await asyncio.gather(small, return_exceptions=True)
    assert queue.queued_bytes == 600
    queue.release(running)
    queue.release(await first)
    assert queue.queued_bytes == 0
