"""The order in which queued requests are admitted: priority classes, and fair shares inside a class.

Why a discipline of its own: one FIFO lets a tenant with a thousand requests in the queue make every other
tenant wait behind all of them. Here each class keeps one FIFO per *flow* (a tenant) and admits from the
flow with the smallest virtual start time (start-time fair queuing): a flow that is admitted advances its
own clock by ``1 / weight``, so backlogged flows are served in proportion to their weights, and a flow that
was idle starts at the class's current virtual time, so it cannot bank credit while it sends nothing. The
discipline is work-conserving: a flow with nothing queued (or that may not run now) is skipped at once and
its share goes to the others. Requests are the unit of the share (output lengths are not known before a
request runs); with requests of a like size that is also a share of the output tokens.

Classes are strict, highest (index 0) first, with one anti-starvation rule: a lower class with waiters
that has been passed over ``starvation_after`` admissions in a row gets the next one it can take. So while
a higher class keeps every slot busy, each lower class still gets at least one admission in every
``starvation_after + 1``; when the higher classes have nobody waiting, the lower ones take every slot.

``fifo`` (a setting) keeps the classes but admits by arrival order inside a class, ignoring flows: the
discipline the gateway had before tenants, kept to compare against.

Pure and synchronous: no clock, no asyncio, so the gateway's queue and the scenario harness run the same
code. Items leave lazily: an item whose ``gone`` is set (timed out, hung up) is skipped and dropped when
reached, and a flow's FIFO is compacted once its dead items outnumber the live ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, Literal, Protocol, TypeVar

Discipline = Literal["fair", "fifo"]


class Item(Protocol):
    gone: bool


W = TypeVar("W", bound=Item)


class _Flow(Generic[W]):
    """One flow's FIFO inside one class, with its virtual time."""

    __slots__ = ("items", "key", "live", "vstart", "weight")

    def __init__(self, key: Hashable, weight: float) -> None:
        self.key = key
        self.weight = weight
        self.items: deque[tuple[int, W]] = deque()  # (arrival sequence, item)
        self.live = 0
        self.vstart = 0.0

    def head_seq(self) -> int:
        while self.items and self.items[0][1].gone:
            self.items.popleft()
        return self.items[0][0] if self.items else -1


class _Class(Generic[W]):
    __slots__ = ("flows", "live", "passed", "vtime")

    def __init__(self) -> None:
        self.flows: dict[Hashable, _Flow[W]] = {}
        self.vtime = 0.0
        self.passed = 0  # admissions that went to a higher class while this one had waiters
        self.live = 0


class FairQueue(Generic[W]):
    """Queued items by class and flow; :meth:`pop` takes the next one to admit."""

    def __init__(self, classes: int, *, discipline: Discipline = "fair", starvation_after: int = 20) -> None:
        if classes < 1:
            raise ValueError("at least one class")
        self.discipline = discipline
        self.starvation_after = starvation_after
        self._classes: list[_Class[W]] = [_Class() for _ in range(classes)]
        self._seq = 0
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def push(self, item: W, *, flow: Hashable, weight: float = 1.0, cls: int = 0) -> None:
        klass = self._classes[cls]
        found = klass.flows.get(flow)
        if found is None:
            found = klass.flows[flow] = _Flow(flow, weight)
        if found.live == 0:  # becomes backlogged: no credit for the time it sent nothing
            found.vstart = max(found.vstart, klass.vtime)
            found.weight = weight
        found.items.append((self._seq, item))
        self._seq += 1
        found.live += 1
        klass.live += 1
        self._live += 1

    def forget(self, *, flow: Hashable, cls: int) -> None:
        """An item of ``flow`` was marked gone while queued: count it out (it is dropped when reached)."""
        klass = self._classes[cls]
        found = klass.flows[flow]
        found.live -= 1
        klass.live -= 1
        self._live -= 1
        if found.live == 0:
            found.items.clear()
        elif len(found.items) > 2 * found.live + 64:
            found.items = deque(entry for entry in found.items if not entry[1].gone)

    def __iter__(self) -> Iterator[W]:
        for klass in self._classes:
            for found in klass.flows.values():
                for _, item in found.items:
                    if not item.gone:
                        yield item

    def clear(self) -> None:
        for klass in self._classes:
            klass.flows.clear()
            klass.live = 0
            klass.passed = 0
        self._live = 0

    def stored(self) -> int:
        """Entries held, the dead ones not yet dropped included (what the memory bound is about)."""
        return sum(len(found.items) for klass in self._classes for found in klass.flows.values())

    def depth(self, cls: int) -> int:
        return self._classes[cls].live

    # --- choosing ---------------------------------------------------------------------------------
    def pop(self, may_run: Callable[[Hashable], bool], place: Callable[[W], bool]) -> W | None:
        """The next item to admit, taken out of the queue, or None when nothing queued can run now.

        ``may_run(flow)`` says whether a flow may have one more request running (its in-flight cap);
        ``place(item)`` whether some upstream can take that item now. An item that cannot be placed does not
        block the items behind it."""
        if not self._live:
            return None
        for index in self._class_order():
            item = self._pop_from(index, may_run, place)
            if item is not None:
                self._count_passed(index)
                return item
        return None

    def _class_order(self) -> list[int]:
        """Classes to try, in order: a starving lower class first (the lowest first), then highest first."""
        waiting = [index for index, klass in enumerate(self._classes) if klass.live]
        if len(waiting) <= 1 or self.starvation_after <= 0:
            return waiting
        starving = [index for index in waiting[1:] if self._classes[index].passed >= self.starvation_after]
        if not starving:
            return waiting
        starving.reverse()
        return starving + [index for index in waiting if index not in starving]

    def _count_passed(self, admitted: int) -> None:
        for index, klass in enumerate(self._classes):
            if index == admitted:
                klass.passed = 0
            elif index > admitted and klass.live:
                klass.passed += 1

    def _pop_from(self, index: int, may_run: Callable[[Hashable], bool], place: Callable[[W], bool]) -> W | None:
        klass = self._classes[index]
        if not klass.live:
            return None
        flows = []
        idle = []
        for found in klass.flows.values():
            if not found.live:
                if found.vstart <= klass.vtime:  # owes nothing: forget it (a flow that comes back starts anew)
                    idle.append(found.key)
            elif may_run(found.key):
                flows.append(found)
        for key in idle:
            del klass.flows[key]
        if self.discipline == "fair":
            flows.sort(key=lambda found: found.vstart)
        else:
            flows.sort(key=_Flow.head_seq)
        for found in flows:
            item = self._take(found, place)
            if item is None:
                continue
            klass.live -= 1
            self._live -= 1
            klass.vtime = max(klass.vtime, found.vstart)
            found.vstart += 1.0 / found.weight
            found.live -= 1
            return item
        return None

    @staticmethod
    def _take(found: _Flow[W], place: Callable[[W], bool]) -> W | None:
        items = found.items
        while items and items[0][1].gone:
            items.popleft()
        if not items:
            return None
        if place(items[0][1]):
            return items.popleft()[1]
        for position, (_, item) in enumerate(items):  # the head waits for a busy upstream: look behind it
            if not item.gone and place(item):
                del items[position]
                return item
        return None
