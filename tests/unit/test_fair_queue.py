"""The admission order: weighted shares inside a class, work conservation, classes and anti-starvation, fifo."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gateway.server.admission.fair_queue import FairQueue


@dataclass(eq=False)
class Req:
    flow: str
    n: int = 0
    cls: int = 0
    gone: bool = False


def fill(queue: FairQueue[Req], flow: str, count: int, *, weight: float = 1.0, cls: int = 0) -> list[Req]:
    items = [Req(flow, n, cls) for n in range(count)]
    for item in items:
        queue.push(item, flow=flow, weight=weight, cls=cls)
    return items


def anyone(_flow: object) -> bool:
    return True


def placeable(_item: Req) -> bool:
    return True


def drain(queue: FairQueue[Req], count: int) -> list[Req]:
    out = []
    for _ in range(count):
        item = queue.pop(anyone, placeable)
        assert item is not None
        out.append(item)
    return out


def test_a_noisy_flow_does_not_delay_a_quiet_one() -> None:
    queue: FairQueue[Req] = FairQueue(1)
    fill(queue, "noisy", 1000)
    drain(queue, 5)
    fill(queue, "quiet", 1)
    # The quiet flow joins at the class's virtual time: it goes next (ties go to the earlier start).
    assert [item.flow for item in drain(queue, 2)].count("quiet") == 1


def test_fifo_serves_by_arrival_whoever_sent_it() -> None:
    queue: FairQueue[Req] = FairQueue(1, discipline="fifo")
    fill(queue, "noisy", 1000)
    fill(queue, "quiet", 1)
    assert all(item.flow == "noisy" for item in drain(queue, 1000))
    assert drain(queue, 1)[0].flow == "quiet"


def test_backlogged_flows_share_by_weight() -> None:
    queue: FairQueue[Req] = FairQueue(1)
    fill(queue, "heavy", 3000, weight=3)
    fill(queue, "light", 3000, weight=1)
    shares = Counter(item.flow for item in drain(queue, 400))
    assert shares["heavy"] == 300 and shares["light"] == 100


def test_an_idle_flow_banks_no_credit() -> None:
    queue: FairQueue[Req] = FairQueue(1)
    fill(queue, "a", 100)
    drain(queue, 100)  # "a" alone: its virtual time ran ahead, and so did the class's
    fill(queue, "b", 100)
    fill(queue, "a", 100)
    shares = Counter(item.flow for item in drain(queue, 20))
    assert shares["a"] == shares["b"] == 10


def test_capacity_a_capped_flow_cannot_use_goes_to_the_others() -> None:
    queue: FairQueue[Req] = FairQueue(1)
    fill(queue, "capped", 10)
    fill(queue, "other", 10)
    taken = [queue.pop(lambda flow: flow != "capped", placeable) for _ in range(10)]
    assert all(item is not None and item.flow == "other" for item in taken)
    assert queue.pop(lambda flow: flow != "capped", placeable) is None
    assert len(queue) == 10


def test_an_unplaceable_head_does_not_block_what_is_behind_it() -> None:
    queue: FairQueue[Req] = FairQueue(1)
    items = fill(queue, "a", 3)
    got = queue.pop(anyone, lambda item: item is not items[0])
    assert got is items[1]
    assert len(queue) == 2


def test_higher_class_first_and_lower_class_gets_every_slot_left() -> None:
    queue: FairQueue[Req] = FairQueue(2, starvation_after=0)
    fill(queue, "batch", 50, cls=1)
    fill(queue, "interactive", 5, cls=0)
    order = [item.flow for item in drain(queue, 55)]
    assert order[:5] == ["interactive"] * 5 and order[5:] == ["batch"] * 50


def test_a_starved_lower_class_gets_one_admission_in_every_n_plus_one() -> None:
    queue: FairQueue[Req] = FairQueue(3, starvation_after=4)
    fill(queue, "top", 1000, cls=0)
    fill(queue, "low", 1000, cls=2)
    order = [item.flow for item in drain(queue, 100)]
    assert order.count("low") == 20  # exactly 1 in 5 while "top" keeps the queue busy
    assert "low" not in order[:4] and order[4] == "low"


def test_strict_priority_starves_without_the_rule() -> None:
    queue: FairQueue[Req] = FairQueue(2, starvation_after=0)
    fill(queue, "top", 1000, cls=0)
    fill(queue, "low", 10, cls=1)
    assert all(item.flow == "top" for item in drain(queue, 1000))


def test_gone_items_are_skipped_and_compacted() -> None:
    queue: FairQueue[Req] = FairQueue(1)
    keep = fill(queue, "a", 1)[0]
    dead = fill(queue, "a", 500)
    for item in dead:
        item.gone = True
        queue.forget(flow="a", cls=0)
    assert len(queue) == 1 and queue.stored() <= 2 * 1 + 64 + 1
    assert drain(queue, 1) == [keep]
    assert queue.pop(anyone, placeable) is None
