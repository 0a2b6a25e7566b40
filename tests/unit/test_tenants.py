"""Tenants: configuration checks, who a request is, the quota bucket, and admission's per-tenant bounds."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.server.admission.admission_queue import AdmissionQueue
from gateway.server.admission.limiter import Limiter
from gateway.server.admission.refusals import QueueFull, QuotaExceeded, TenantQueueFull
from gateway.server.admission.reserve import Reserve
from gateway.server.admission.tenants import MAX_NAMED_TENANTS, Tenant, TenantDirectory, TokenBucket
from gateway.settings import Settings
from tests.unit.test_admission import FakeClock, Target
from tests.unit.test_serve_cli import run_serve


def settings(**values: object) -> Settings:
    return Settings(upstreams=["http://127.0.0.1:9"], **values)


# --- configuration ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tenants", "extra", "expected"),
    [
        ([{"name": "a", "api_keys": ["k"]}, {"name": "b", "api_keys": ["k"]}], {}, "keys must be unique"),
        ([{"name": "a", "api_keys": ["k"]}], {"api_keys": ["k"]}, "keys must be unique"),
        ([{"name": "a", "weight": 0}], {}, "weight must be > 0"),
        ([{"name": "a", "weight": -1}], {}, "weight must be > 0"),
        ([{"name": "a", "priority": "urgent"}], {}, "priority 'urgent' is not one of"),
        ([{"name": "a", "priority": "interactive", "max_priority": "batch"}], {}, "below its priority"),
        ([{"name": "a"}, {"name": "a"}], {}, "configured twice"),
        ([{"name": "other"}], {}, "reserved"),
        ([{"name": "a", "api_keys": ["k"]}], {"tenant_header": "x-tenant"}, "without client keys"),
        ([], {"default_priority": "urgent"}, "default_priority"),
    ],
)
def test_bad_tenant_tables_are_refused(tenants: list, extra: dict, expected: str) -> None:
    with pytest.raises(ValidationError, match=expected):
        settings(tenants=tenants, **extra)


def test_a_bad_tenant_table_exits_2_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(
        'upstreams = ["http://127.0.0.1:9"]\n[[tenants]]\nname = "a"\napi_keys = ["k"]\n'
        '[[tenants]]\nname = "b"\napi_keys = ["k"]\n'
    )
    result = run_serve("--config", str(config))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "keys must be unique" in lines[0], result.stderr


def test_a_tenant_table_from_toml(tmp_path: Path) -> None:
    from gateway.settings import load_settings

    config = tmp_path / "ok.toml"
    config.write_text(
        'upstreams = ["http://127.0.0.1:9"]\n[[tenants]]\nname = "a"\napi_keys = ["ka"]\nweight = 3\n'
        'priority = "batch"\nmax_priority = "standard"\nmax_queued = 5\noutput_tokens_per_minute = 600\n'
    )
    loaded = load_settings(config)
    assert loaded.tenants[0].weight == 3 and loaded.tenants[0].max_queued == 5


# --- identification ----------------------------------------------------------------------------------
def directory(**values: object) -> TenantDirectory:
    return TenantDirectory(settings(**values), clock=FakeClock())


def test_keys_name_tenants_and_anything_else_is_refused() -> None:
    tenants = directory(
        tenants=[{"name": "a", "api_keys": ["ka", "ka2"]}, {"name": "b", "api_keys": ["kb"]}], api_keys=["plain"]
    )
    assert tenants.identify(b"Bearer ka").name == "a"  # type: ignore[union-attr]
    assert tenants.identify(b"Bearer ka2").name == "a"  # type: ignore[union-attr]
    assert tenants.identify(b"Bearer kb").name == "b"  # type: ignore[union-attr]
    assert tenants.identify(b"Bearer plain") is tenants.default
    assert tenants.identify(b"Bearer nope") is None and tenants.identify(None) is None
    assert tenants.identify(b"Bearer ka", named=b"b").name == "a"  # type: ignore[union-attr]  # no header with keys
    assert tenants.identify(None, b" kb").name == "b"  # type: ignore[union-attr]  # x-api-key, Anthropic's SDK
    assert tenants.identify(b"Bearer nope", b"kb").name == "b"  # type: ignore[union-attr]


def test_without_keys_everything_is_default_unless_a_header_is_trusted() -> None:
    plain = directory()
    assert plain.identify(None, named=b"someone") is plain.default
    named = directory(tenant_header="X-Tenant", tenants=[{"name": "gold", "weight": 4}])
    assert named.identify(None, named=b"gold").weight == 4  # type: ignore[union-attr]
    guest = named.identify(None, named=b"guest")
    assert guest is not None and guest.label == "other" and guest.weight == 1
    assert named.identify(None, named=b"guest") is guest
    assert named.identify(None, named=None) is named.default


def test_header_named_tenants_are_bounded() -> None:
    named = directory(tenant_header="x-tenant")
    first = [named.by_name(f"t{n}") for n in range(MAX_NAMED_TENANTS)]
    first[0].queued = 1  # still waiting: kept
    later = named.by_name("late")
    assert later.name == "late" and named.by_name("t0") is first[0]
    assert sum(1 for _ in named) <= MAX_NAMED_TENANTS + 2
    assert {tenant.label for tenant in named} == {"default", "other"}


def test_a_client_may_lower_its_class_and_raise_it_only_to_its_cap() -> None:
    tenants = directory(
        tenants=[
            {"name": "a", "api_keys": ["ka"], "priority": "batch", "max_priority": "standard"},
            {"name": "b", "api_keys": ["kb"]},
        ]
    )
    a, b = tenants.identify(b"Bearer ka"), tenants.identify(b"Bearer kb")
    assert a is not None and b is not None
    standard, batch = 1, 2  # the classes below interactive (0)
    assert a.class_for(None) == batch
    assert tenants.asked_class(a, "interactive") == standard  # asked above its cap: its cap
    assert tenants.asked_class(b, " interactive") == standard and tenants.asked_class(b, "batch") == batch
    with pytest.raises(ValueError, match="unknown priority class"):
        tenants.asked_class(a, "urgent")


def test_an_integer_priority_asks_for_the_class_above_or_below_by_its_sign() -> None:
    tenants = directory(
        tenants=[
            {"name": "a", "api_keys": ["ka"], "max_priority": "interactive"},
            {"name": "b", "api_keys": ["kb"], "priority": "batch"},
        ]
    )
    a, b = tenants.identify(b"Bearer ka"), tenants.identify(b"Bearer kb")
    assert a is not None and b is not None
    assert [tenants.asked_class(a, raw) for raw in ("5", "0", "-1", "-7")] == [0, 1, 2, 2]
    assert [tenants.asked_class(b, raw) for raw in ("1", "0", "-1")] == [2, 2, 2]  # cannot raise itself


# --- the quota bucket --------------------------------------------------------------------------------
def test_the_quota_refills_continuously_up_to_one_minute() -> None:
    bucket = TokenBucket(600, now=0.0)  # 10 tokens a second
    assert bucket.retry_after(0.0) is None
    bucket.spend(900, 0.0)  # one request may overspend: it is never cut
    assert bucket.retry_after(0.0) == 31  # 300 tokens owed at 10 a second: positive after 30 s
    assert bucket.retry_after(29.5) == 1
    assert bucket.retry_after(30.5) is None
    bucket.spend(0, 10_000.0)
    assert bucket.level == 600  # an idle tenant banks one minute's worth, no more


# --- admission with tenants --------------------------------------------------------------------------
def queue_of(
    limit: int, *, max_queue: int = 100, classes: int = 1, clock: FakeClock | None = None
) -> AdmissionQueue[Target]:
    return AdmissionQueue(
        [Target("a", Limiter("a", limit))], max_queue=max_queue, clock=clock or FakeClock(), classes=classes
    )


async def test_a_tenant_over_its_queue_cap_gets_429_from_its_own_drain_rate() -> None:
    clock = FakeClock()
    queue = queue_of(2, clock=clock)
    capped, other = Tenant("capped", max_queued=2), Tenant("other")
    for _ in range(4):  # its own requests finished at one a second: 3 queued ahead -> 3 s
        queue.release(await queue.acquire(tenant=capped, timeout_s=1))
        clock.now += 1.0
    held = [await queue.acquire(tenant=capped, timeout_s=1) for _ in range(2)]
    waiting = [asyncio.create_task(queue.acquire(tenant=capped, timeout_s=10)) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(TenantQueueFull) as refused:
        await queue.acquire(tenant=capped, timeout_s=1)
    assert refused.value.status == 429 and refused.value.retry_after_s == 3
    others = [asyncio.create_task(queue.acquire(tenant=other, timeout_s=10)) for _ in range(5)]
    await asyncio.sleep(0)
    assert other.queued == 5  # untouched by the other's cap
    for permit in held:
        queue.release(permit)
    assert capped.queued + other.queued == 5 and queue.depth == 5  # two admitted
    for task in waiting + others:
        task.cancel()
    await asyncio.gather(*waiting, *others, return_exceptions=True)
    assert queue.depth == 0 and capped.queued == other.queued == 0


async def test_the_total_bound_still_holds() -> None:
    queue = queue_of(1, max_queue=2)
    held = await queue.acquire(tenant=Tenant("a"), timeout_s=1)
    waiting = [asyncio.create_task(queue.acquire(tenant=Tenant(f"t{n}"), timeout_s=10)) for n in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(QueueFull):
        await queue.acquire(tenant=Tenant("late"), timeout_s=1)
    queue.release(held)
    for task in waiting:
        queue.release(await task)


async def test_a_tenant_at_its_inflight_cap_waits_while_others_use_the_slots() -> None:
    queue = queue_of(4)
    capped, other = Tenant("capped", max_inflight=1), Tenant("other")
    first = await queue.acquire(tenant=capped, timeout_s=1)
    second = asyncio.create_task(queue.acquire(tenant=capped, timeout_s=10))
    await asyncio.sleep(0)
    assert not second.done() and capped.queued == 1
    mine = [await asyncio.wait_for(queue.acquire(tenant=other, timeout_s=1), 1) for _ in range(3)]  # at once
    assert other.inflight == 3
    queue.release(first)
    permit = await asyncio.wait_for(second, 1)
    assert permit.tenant is capped and capped.inflight == 1
    for p in [permit, *mine]:
        queue.release(p)
    assert capped.inflight == other.inflight == 0


async def test_an_exhausted_quota_is_a_429_until_it_refills() -> None:
    clock = FakeClock()
    queue = queue_of(4, clock=clock)
    tenant = Tenant("a", quota=TokenBucket(60, clock.now))  # a token a second
    permit = await queue.acquire(tenant=tenant, timeout_s=1)
    tenant.spend(70, clock.now)
    queue.release(permit)
    with pytest.raises(QuotaExceeded) as refused:
        await queue.acquire(tenant=tenant, timeout_s=1)
    assert refused.value.status == 429 and refused.value.retry_after_s == 11
    other = await queue.acquire(tenant=Tenant("b"), timeout_s=1)  # the others are untouched
    queue.release(other)
    clock.now += 10.5
    queue.release(await queue.acquire(tenant=tenant, timeout_s=1))


async def test_weights_share_a_contended_limit() -> None:
    queue = queue_of(4, max_queue=1000)
    heavy, light = Tenant("heavy", weight=3), Tenant("light", weight=1)
    held = [await queue.acquire(tenant=heavy, timeout_s=1) for _ in range(4)]
    admitted: list[str] = []

    async def one(tenant: Tenant) -> None:
        permit = await queue.acquire(tenant=tenant, timeout_s=60)
        admitted.append(tenant.name)
        await asyncio.sleep(0)
        queue.release(permit)

    tasks = [asyncio.create_task(one(t)) for t in [heavy] * 300 + [light] * 300]
    await asyncio.sleep(0)
    for permit in held:
        queue.release(permit)
    for _ in range(10_000):
        if len(admitted) >= 200:
            break
        await asyncio.sleep(0)
    shares = Counter(admitted[:200])
    assert 145 <= shares["heavy"] <= 155, shares
    await asyncio.gather(*tasks)


async def test_the_interactive_class_passes_a_batch_backlog() -> None:
    queue = queue_of(2, classes=2, max_queue=2000)
    batch, interactive = Tenant("batch", priority=1, max_priority=1), Tenant("interactive")
    held = [await queue.acquire(tenant=batch, priority=1, timeout_s=1) for _ in range(2)]
    backlog = [asyncio.create_task(queue.acquire(tenant=batch, priority=1, timeout_s=60)) for _ in range(1000)]
    await asyncio.sleep(0)
    urgent = asyncio.create_task(queue.acquire(tenant=interactive, priority=0, timeout_s=60))
    await asyncio.sleep(0)
    queue.release(held[0])
    permit = await asyncio.wait_for(urgent, 1)
    assert permit.tenant is interactive and batch.queued == 1000
    queue.release(permit)  # nobody interactive waits: batch takes the slot
    await asyncio.sleep(0)
    assert batch.queued == 999
    for task in backlog:
        task.cancel()
    await asyncio.gather(*backlog, return_exceptions=True)


def reserved_queue(limit: int, reserve: float = 0.1, classes: int = 1) -> AdmissionQueue[Target]:
    return AdmissionQueue(
        [Target("a", Limiter("a", limit))], max_queue=100, clock=FakeClock(), reserve=reserve, classes=classes
    )


async def test_a_light_tenant_finds_a_reserved_slot_and_the_limit_holds() -> None:
    queue = reserved_queue(10)  # one slot reserved
    limiter = queue.targets["a"].limiter
    heavy, light = Tenant("heavy"), Tenant("light")
    mine = [await queue.acquire(tenant=light, timeout_s=1)]
    held = [await queue.acquire(tenant=heavy, timeout_s=1) for _ in range(8)]
    assert limiter.inflight == 9
    # The top slot: heavy holds more than half its share (10 / 2 / 2), light has a request running.
    backlog = [asyncio.create_task(queue.acquire(tenant=heavy, timeout_s=60)) for _ in range(10)]
    await asyncio.sleep(0)
    assert heavy.queued == 10 and limiter.inflight == 9
    mine.append(await asyncio.wait_for(queue.acquire(tenant=light, timeout_s=1), 1))  # at once, at the limit
    assert limiter.inflight == 10 == limiter.limit
    third = asyncio.create_task(queue.acquire(tenant=light, timeout_s=60))  # never above the limit: it waits
    await asyncio.sleep(0)
    assert light.queued == 1 and limiter.inflight == 10
    queue.release(held.pop())
    queue.release(held.pop())  # two releases, two admissions: one of them light's (equal weights)
    assert light.queued == 0 and heavy.queued == 9 and limiter.inflight == 10
    mine.append(await third)
    queue.release(mine.pop())
    assert limiter.inflight == 9 and heavy.queued == 9  # light runs two, nothing queued: the top slot is kept
    for permit in mine:
        queue.release(permit)
    assert light.inflight == 0 and limiter.inflight == 10  # light has nothing running: nothing is held back
    for permit in held:
        queue.release(permit)
    for task in backlog:
        task.cancel()
    await asyncio.gather(*backlog, return_exceptions=True)


async def test_with_no_light_tenant_running_every_slot_is_anyones() -> None:
    queue = reserved_queue(10, reserve=0.3)
    limiter = queue.targets["a"].limiter
    only = Tenant("only")
    held = [await queue.acquire(tenant=only, timeout_s=1) for _ in range(10)]
    assert limiter.inflight == 10
    for permit in held:
        queue.release(permit)
    a, b = Tenant("a"), Tenant("b")  # both at their share: neither is light
    held = [await queue.acquire(tenant=t, timeout_s=1) for t in [a, b] * 5]
    assert limiter.inflight == 10
    for permit in held:
        queue.release(permit)


async def test_a_light_tenant_of_a_lower_class_holds_nothing_back_from_a_higher_one() -> None:
    queue = reserved_queue(10, classes=2)
    limiter = queue.targets["a"].limiter
    batch, interactive = Tenant("batch", priority=1, max_priority=1), Tenant("interactive")
    held = [await queue.acquire(tenant=batch, priority=1, timeout_s=1)]
    held += [await queue.acquire(tenant=interactive, timeout_s=1) for _ in range(9)]
    assert limiter.inflight == 10
    for permit in held:
        queue.release(permit)


def test_the_reserve_is_never_the_whole_limit() -> None:
    reserve = Reserve(0.5)
    assert [reserve.held(limit) for limit in (1, 2, 3, 10)] == [0, 1, 1, 5]
    assert Reserve(0.0).held(10) == 0 and Reserve(0.01).held(10) == 1
