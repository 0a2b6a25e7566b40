"""LoRA affinity (gateway.server.admission.lora_affinity) inside the router, and the admission queue around it.

The rule: among upstreams with room, an adapter's request scores ``+weight`` where the adapter runs (the gateway's
own requests in flight, or vLLM's scraped ``running_lora_adapters``), ``+weight/2`` where it ran recently,
``-swap_penalty`` where ``max_lora`` other adapters run; the load term is prefix routing's. The queue's order is
never changed by it: a cold adapter keeps its place.
"""

from __future__ import annotations

import asyncio

from gateway.server.admission.admission_queue import AdmissionQueue
from gateway.server.admission.limiter import Limiter
from gateway.server.admission.lora_affinity import (
    PLACEMENT_COLD,
    PLACEMENT_RESIDENT,
    PLACEMENT_RUNNING,
    PLACEMENT_SWAP,
    AdapterAffinity,
    AdapterLedger,
)
from gateway.server.admission.routing import PrefixMap, PrefixRouter, RouteHint, RouteObserver
from gateway.telemetry.backends.snapshot import LoraState
from tests.unit.test_routing import Target


class Clock:
    def __call__(self) -> float:
        return 100.0


class Recorder(RouteObserver):
    def __init__(self) -> None:
        self.placements: list[tuple[str, str]] = []

    def adapter_placed(self, placement: str, upstream: str) -> None:
        self.placements.append((placement, upstream))


def ups(*names: str, limit: int = 10) -> list[Target]:
    return [Target(name, Limiter(name, limit)) for name in names]


def make(states: dict[str, LoraState] | None = None, **kwargs: float) -> tuple[PrefixRouter, Recorder]:
    known = states if states is not None else {}
    seen = Recorder()
    affinity = AdapterAffinity(known.get, **kwargs)
    return PrefixRouter(PrefixMap(max_entries=100, ttl_s=60, clock=Clock()), observer=seen, adapters=affinity), seen


def adapter(name: str) -> RouteHint:
    return RouteHint((), name)


# --- placements ------------------------------------------------------------------------------------------------


def test_placements_from_the_ledger_and_the_scrape() -> None:
    states = {"a": LoraState(running=("x",), max_lora=2), "b": LoraState(running=("y", "z"), max_lora=2)}
    affinity = AdapterAffinity(states.get)
    assert affinity.placement("a", "x") == PLACEMENT_RUNNING  # vLLM runs it (another client's requests)
    assert affinity.placement("b", "x") == PLACEMENT_SWAP  # two others fill max_lora=2
    assert affinity.placement("a", "w") == PLACEMENT_COLD  # one slot free
    affinity.ledger.placed("a", "w")
    assert affinity.placement("a", "w") == PLACEMENT_RUNNING  # the gateway's own request, before any scrape
    assert affinity.placement("a", "v") == PLACEMENT_SWAP  # x (scraped) and w (own) fill it
    affinity.ledger.released("a", "w")
    assert affinity.placement("a", "w") == PLACEMENT_RESIDENT  # ran there last: likely still loaded
    assert affinity.placement("c", "w") == PLACEMENT_COLD  # no state, no history: unknown, never a swap


def test_the_ledger_counts_and_never_goes_negative() -> None:
    ledger = AdapterLedger(recent_max=2)
    ledger.placed("u", "a")
    ledger.placed("u", "a")
    ledger.released("u", "a")
    assert ledger.inflight("u") == {"a"}
    ledger.released("u", "a")
    ledger.released("u", "a")  # an extra release (a permit of another router) changes nothing
    assert ledger.inflight("u") == set()
    ledger.placed("u", "b")
    ledger.placed("u", "c")
    assert ledger.recent("u", 5) == ["c", "b"]  # bounded at 2, newest first
    ledger.forget("u")
    assert ledger.recent("u", 5) == [] and ledger.inflight("u") == set()


# --- the router --------------------------------------------------------------------------------------------------


def test_an_adapter_returns_where_it_runs_until_that_is_busier_than_affinity_is_worth() -> None:
    router, seen = make(weight=0.5)
    a, b = ups("a", "b")
    first = router.choose([a, b], adapter("sql"))
    first.limiter.acquire()
    chosen = [first]
    for _ in range(4):  # up to 4 more in flight there: 0.5 of affinity outweighs a 0.4 load gap
        target = router.choose([a, b], adapter("sql"))
        target.limiter.acquire()
        chosen.append(target)
    assert all(t is first for t in chosen)
    other = b if first is a else a
    target = router.choose([a, b], adapter("sql"))  # 5 of 10 busy: the idle one wins, the adapter spreads
    assert target is other
    assert [p for p, _ in seen.placements] == [PLACEMENT_COLD] + [PLACEMENT_RUNNING] * 4 + [PLACEMENT_COLD]


def test_a_swap_is_avoided_where_another_upstream_has_a_free_adapter_slot() -> None:
    states = {"a": LoraState(running=("hot",), max_lora=1), "b": LoraState(running=("hot",), max_lora=2)}
    router, seen = make(states)
    a, b = ups("a", "b")
    for _ in range(3):
        b.limiter.acquire()  # b is busier, but a would make the request wait for hot to drain
    assert router.choose([a, b], adapter("cold")) is b
    assert seen.placements[-1] == (PLACEMENT_COLD, "b")
    assert router.choose([a], adapter("cold")) is a  # the only one with room: placed there anyway, counted
    assert seen.placements[-1] == (PLACEMENT_SWAP, "a")


def test_requests_without_an_adapter_are_routed_by_load_and_prefix_only() -> None:
    router, seen = make({"a": LoraState(running=("x",), max_lora=1)})
    a, b = ups("a", "b")
    b.limiter.acquire()
    assert router.choose([a, b], RouteHint(())) is a
    assert seen.placements == []
    plain = PrefixRouter(PrefixMap(max_entries=10, ttl_s=60, clock=Clock()))
    assert plain.hint(None, "sql").adapter is None  # affinity off: the hint carries no adapter


# --- the queue around it -------------------------------------------------------------------------------------------


async def test_the_ledger_follows_permits_through_the_queue() -> None:
    router, _ = make()
    a, b = ups("a", "b", limit=1)
    queue: AdmissionQueue[Target] = AdmissionQueue(
        [a, b], max_queue=10, clock=Clock(), choose=router.choose, routed_release=router.released
    )
    ledger = router.adapters.ledger  # type: ignore[union-attr]
    first = await queue.acquire(timeout_s=1, hint=adapter("sql"))
    assert ledger.inflight(first.target.name) == {"sql"}
    queue.release(first)
    queue.release(first)  # idempotent: counted once
    assert ledger.inflight(first.target.name) == set()
    plain = await queue.acquire(timeout_s=1)  # no hint: not the router's, nothing to count
    assert plain.routed is None
    queue.release(plain)


async def test_a_cold_adapter_keeps_its_place_in_the_queue() -> None:
    """Both upstreams run only the hot adapter, at their limit, with max_lora = 1 there: a request for a cold
    adapter queued first is admitted first, on the first slot that frees, though every later request (hot)
    would fit there better. Affinity chooses where, never who goes next."""
    states = {"a": LoraState(running=("hot",), max_lora=1), "b": LoraState(running=("hot",), max_lora=1)}
    router, seen = make(states)
    a, b = ups("a", "b", limit=1)
    queue: AdmissionQueue[Target] = AdmissionQueue(
        [a, b], max_queue=10, clock=Clock(), choose=router.choose, routed_release=router.released
    )
    running = [await queue.acquire(timeout_s=1, hint=adapter("hot")) for _ in range(2)]
    cold = asyncio.create_task(queue.acquire(timeout_s=5, hint=adapter("cold")))
    await asyncio.sleep(0)
    hot = [asyncio.create_task(queue.acquire(timeout_s=5, hint=adapter("hot"))) for _ in range(3)]
    await asyncio.sleep(0)
    assert queue.depth == 4
    queue.release(running[0])
    admitted = await cold
    assert admitted.target is running[0].target
    assert queue.depth == 3 and not any(task.done() for task in hot)  # the hot ones still wait behind it
    assert seen.placements[-1] == (PLACEMENT_SWAP, running[0].target.name)  # counted: it causes a swap there
    queue.release(running[1])
    queue.release(admitted)
    for task in hot:
        queue.release(await task)
    assert queue.depth == 0


def test_the_pool_tells_adapters_from_models_by_their_parent() -> None:
    from gateway.control.window import SlidingWindow
    from gateway.server.upstream.pool import Upstream, UpstreamPool

    def upstream(url: str, models: list[dict[str, object]]) -> Upstream:
        return Upstream(url, Limiter(url, 4), SlidingWindow(10.0), models=models)

    base = {"id": "base", "parent": None}
    a = upstream("http://a", [base, {"id": "sql", "parent": "base", "root": "/adapters/sql"}])
    b = upstream("http://b", [base])
    pool = UpstreamPool([a, b])
    assert a.adapters == {"sql"} and b.adapters == frozenset()
    assert pool.is_adapter("sql") and not pool.is_adapter("base") and not pool.is_adapter("other")
    assert pool.resolve("sql").eligible == ["http://a"]  # only where it is listed
    a.models = [base]  # unloaded: a new list, read again
    assert not pool.is_adapter("sql")
    a.lora = LoraState(running=("x",), max_lora=2)
    assert pool.lora_state("http://a") == a.lora and pool.lora_state("http://b") is None
    assert pool.lora_state("http://gone") is None
