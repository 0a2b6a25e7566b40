"""The shared state trusts nothing it reads (``gateway.server.feedback.share_board``): every kind of bad entry is
rejected with its reason, deleted and counted, the good ones beside it still count, and a control tick goes on
for every other upstream when one upstream's exchange or controller raises.

Redis here is a dict behind the three calls the board makes; tests/integration/test_share_board.py runs the
same against a real redis-server, with two gateways and a poisoning writer."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.control.share import Entry, Peers
from gateway.server.feedback import share_board
from gateway.server.feedback.control_loop import ControlLoop
from gateway.server.feedback.share_board import (
    CLOCK_SKEW_S,
    NAMESPACE,
    REJECT_REASONS,
    REPLICA_ID,
    Bounds,
    ShareBoard,
    check_entry,
    default_namespace,
    replica_id,
)
from gateway.server.parts import Gateway
from gateway.settings import Settings

NOW = 1_700_000_000.0
BOUNDS = Bounds.of(limit_min=2, limit_max=64, max_queue=100)  # a demand of at most 164


def check(value: bytes, field: bytes = b"gw-1:42") -> Entry | str:
    return check_entry(field, value, NOW, BOUNDS)


# --- what an entry may hold ------------------------------------------------------------------------------
def test_the_bounds_are_limit_max_in_flight_plus_a_full_queue() -> None:
    assert (BOUNDS.limit_min, BOUNDS.limit_max, BOUNDS.demand_max) == (2, 64, 164)


@pytest.mark.parametrize(
    "value",
    [
        b"12 8 1700000000.000",  # what the gateway writes
        b"0 2 1700000000",  # idle, at limit_min
        b"164 64 1699999990.5",  # the most demand, limit_max, nearly stale (age is judged elsewhere)
        b"1.5e+01 8.0 1700000001.999",  # %g's exponent; a whole limit written as a float
        b"12 8 1699990000",  # long stale: no error, the age check drops it
    ],
)
def test_an_entry_in_range_is_taken(value: bytes) -> None:
    entry = check(value)
    assert isinstance(entry, Entry) and entry.replica == "gw-1:42"
    assert all(math.isfinite(x) for x in (entry.demand, entry.limit, entry.at))


def test_an_entry_dated_ahead_within_the_clock_skew_is_taken() -> None:
    assert isinstance(check(f"12 8 {NOW + CLOCK_SKEW_S:.3f}".encode()), Entry)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        # nan and inf anywhere: nan made every tick raise; at=inf never expired
        (b"nan 8 1700000000", "not_finite"),
        (b"12 nan 1700000000", "not_finite"),
        (b"12 8 nan", "not_finite"),
        (b"inf 8 1700000000", "not_finite"),
        (b"12 8 inf", "not_finite"),
        (b"12 8 -Infinity", "not_finite"),
        (b"1e999 8 1700000000", "not_finite"),  # overflows to inf
        # negative, out of range, absurd
        (b"-1 8 1700000000", "out_of_range"),
        (b"12 -8 1700000000", "out_of_range"),
        (b"12 8 -5", "out_of_range"),
        (b"12 1 1700000000", "out_of_range"),  # under limit_min
        (b"12 65 1700000000", "out_of_range"),  # over limit_max
        (b"165 8 1700000000", "out_of_range"),  # more demand than limit_max + max_queue
        (b"1e9 8 1700000000", "out_of_range"),  # the absurd demand that pinned every share to 1
        # from the future
        (f"12 8 {NOW + CLOCK_SKEW_S + 0.01:.3f}".encode(), "future"),
        (b"12 8 9999999999", "future"),
        # missing fields, extra fields, wrong types, garbage bytes
        (b"", "malformed"),
        (b"12 8", "malformed"),
        (b"12", "malformed"),
        (b"12 8 1700000000 7", "malformed"),
        (b"12  8 1700000000", "malformed"),  # two spaces: an empty field
        (b"12 8 1700000000 ", "malformed"),
        (b"twelve 8 1700000000", "malformed"),
        (b"12 8.5 1700000000", "malformed"),  # a limit is whole
        (b"1_000 8 1700000000", "malformed"),  # float() would take it
        (b"0x10 8 1700000000", "malformed"),
        (b"12 8 1700000000\n", "malformed"),
        (b"\xff\xfe\x00 8 1700000000", "malformed"),
        ("١٢ 8 1700000000".encode(), "malformed"),  # Arabic-Indic digits: float() would take them too
        (b'{"demand": 12, "limit": 8}', "malformed"),
        (b"1" * 65, "malformed"),  # longer than anything the gateway writes
    ],
)
def test_a_bad_entry_is_rejected_with_its_reason(value: bytes, reason: str) -> None:
    assert check(value) == reason
    assert reason in REJECT_REASONS


@pytest.mark.parametrize(
    "field",
    [b"a", b"gw-1", b"gw-1:", b":42", b"gw 1:42", b"gw-1:42:7", b"gw-1:4x", b"gw/1:42", b"\xff:42", b"h" * 254 + b":1"],
)
def test_a_field_that_is_no_replica_id_is_rejected(field: bytes) -> None:
    assert check(b"12 8 1700000000", field) == "replica_id"


def test_this_replicas_own_id_is_of_the_form_the_others_accept(monkeypatch) -> None:
    assert REPLICA_ID.fullmatch(replica_id())
    monkeypatch.setattr(share_board.socket, "gethostname", lambda: "pod ä/1:x")
    assert REPLICA_ID.fullmatch(replica_id()) and replica_id().startswith("pod---1-x:")
    monkeypatch.setattr(share_board.socket, "gethostname", lambda: "")
    assert REPLICA_ID.fullmatch(replica_id())


def test_a_board_refuses_an_id_or_namespace_the_others_would_reject() -> None:
    with pytest.raises(ValueError, match="host:pid"):
        ShareBoard("redis://x", 10, bounds=BOUNDS, namespace="n", replica="a", client=FakeRedis())
    with pytest.raises(ValueError, match="namespace"):
        ShareBoard("redis://x", 10, bounds=BOUNDS, namespace="a:b", client=FakeRedis())


# --- the namespace -------------------------------------------------------------------------------------
def test_the_default_namespace_is_the_configuration_the_entries_are_checked_against() -> None:
    one = default_namespace(["http://b:8000", "http://a:8000"], 1, 256, 1024)
    assert NAMESPACE.fullmatch(one) and len(one) == 12
    assert one == default_namespace(["http://a:8000", "http://b:8000", "http://a:8000"], 1, 256, 1024)
    others = {
        default_namespace(["http://a:8000"], 1, 256, 1024),
        default_namespace(["http://a:8000", "http://b:8000"], 2, 256, 1024),
        default_namespace(["http://a:8000", "http://b:8000"], 1, 128, 1024),
        default_namespace(["http://a:8000", "http://b:8000"], 1, 256, 64),
    }
    assert one not in others and len(others) == 4


async def test_the_gateway_keys_its_board_by_namespace() -> None:
    settings = Settings(upstreams=["http://b:8000", "http://a:8000"], share_redis_url="redis://127.0.0.1:1/0")
    gateways = [Gateway.build(settings), Gateway.build(settings.model_copy(update={"share_namespace": "staging"}))]
    try:
        derived, named = (ControlLoop.build(gateway).board for gateway in gateways)
        assert derived is not None and named is not None
        assert derived.namespace == default_namespace(settings.upstreams, 1, 256, 1024)
        assert derived.key("http://a:8000") == f"sweetspot:share:{derived.namespace}:http://a:8000"
        assert derived.bounds == Bounds(1, 256, 256 + 1024)
        assert named.key("http://a:8000") == "sweetspot:share:staging:http://a:8000"
        for board_ in (derived, named):
            await board_.close()
    finally:
        for gateway in gateways:
            await gateway.client.close()


# --- the exchange: rejected entries deleted and counted, the good ones kept --------------------------------
class FakeRedis:
    """The hash commands the board sends, on dicts; ``down`` makes every call fail as a lost connection does."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}
        self.down = False

    def pipeline(self, transaction: bool = False) -> FakePipeline:
        return FakePipeline(self)

    def _hash(self, key: str) -> dict[bytes, bytes]:
        if self.down:
            raise ConnectionError("Redis went away")
        value = self.keys.setdefault(key, {})
        if not isinstance(value, dict):
            raise RuntimeError("WRONGTYPE Operation against a key holding the wrong kind of value")
        return value

    async def hdel(self, key: str, *fields: bytes) -> int:
        table = self._hash(key)
        return sum(table.pop(f, None) is not None for f in fields)

    async def delete(self, key: str) -> int:
        return int(self.keys.pop(key, None) is not None)

    async def aclose(self) -> None:
        pass


class FakePipeline:
    def __init__(self, redis: FakeRedis) -> None:
        self.redis, self.calls = redis, []  # type: ignore[var-annotated]

    def hset(self, key: str, field: str, value: str) -> None:
        self.calls.append(lambda: self.redis._hash(key).__setitem__(field.encode(), value.encode()))

    def expire(self, key: str, seconds: int) -> None:
        self.calls.append(lambda: True)

    def hgetall(self, key: str) -> None:
        self.calls.append(lambda: dict(self.redis._hash(key)))

    async def execute(self) -> list[Any]:
        return [call() for call in self.calls]


def board(redis: FakeRedis, rejected: list[tuple[str, str]], replica: str = "me:1") -> ShareBoard:
    return ShareBoard(
        "redis://unused",
        10,
        bounds=BOUNDS,
        namespace="t",
        replica=replica,
        wall_clock=lambda: NOW,
        client=redis,
        on_reject=lambda upstream, reason: rejected.append((upstream, reason)),
    )


POISON = {
    b"evil:1": b"nan 8 1700000000",
    b"evil:2": b"1e12 8 1700000000",
    b"evil:3": b"12 8 inf",
    b"evil:4": b"12 8 9999999999",
    b"evil:5": b"12 999 1700000000",
    b"evil:6": b"\x00\x01garbage",
    b"evil:7": b"",
    b"not an id": b"12 8 1700000000",
}


async def test_bad_entries_are_deleted_and_counted_and_the_good_ones_still_count() -> None:
    redis, rejected = FakeRedis(), []  # type: ignore[var-annotated]
    key = "sweetspot:share:t:http://u"
    redis.keys[key] = {b"peer:2": b"20 10 1699999999.000", b"gone:3": b"5 5 1699999000.000", **POISON}
    peers = await board(redis, rejected, replica="x:1").exchange("http://u", 30, 12)
    assert peers is not None and (peers.replicas, peers.demand, peers.limit) == (1, 20, 10)
    assert peers.leader is not None and peers.leader.replica == "peer:2"  # the lowest id whose limit binds
    assert sorted(reason for _, reason in rejected) == sorted(
        ["not_finite", "out_of_range", "not_finite", "future", "out_of_range", "malformed", "malformed", "replica_id"]
    )
    assert {upstream for upstream, _ in rejected} == {"http://u"}
    assert set(redis.keys[key]) == {b"x:1", b"peer:2"}  # the rejected and the stale ones are gone
    rejected.clear()
    assert await board(redis, rejected, replica="x:1").exchange("http://u", 30, 12) is not None and rejected == []


async def test_with_only_bad_entries_a_replica_is_on_its_own() -> None:
    redis, rejected = FakeRedis(), []  # type: ignore[var-annotated]
    redis.keys["sweetspot:share:t:http://u"] = dict(POISON)
    assert await board(redis, rejected).exchange("http://u", 30, 12) is None
    assert len(rejected) == len(POISON)


async def test_a_key_that_is_not_a_hash_is_deleted_whole_and_counted() -> None:
    redis, rejected = FakeRedis(), []  # type: ignore[var-annotated]
    me = board(redis, rejected)
    redis.keys["sweetspot:share:t:http://u"] = b"garbage"
    assert await me.exchange("http://u", 30, 12) is None and rejected == [("http://u", "malformed")]
    assert not me.failing  # Redis answered: no outage
    await board(redis, [], replica="peer:2").exchange("http://u", 20, 10)
    assert await me.exchange("http://u", 30, 12) is not None


async def test_namespaces_do_not_mix() -> None:
    redis = FakeRedis()
    a = board(redis, [], replica="a:1")
    b = ShareBoard(
        "redis://unused", 10, bounds=BOUNDS, namespace="other", replica="b:1", wall_clock=lambda: NOW, client=redis
    )
    await a.exchange("http://u", 20, 10)
    assert await b.exchange("http://u", 20, 10) is None
    assert await board(redis, [], replica="c:1").exchange("http://u", 20, 10) is not None


# --- the control tick: one upstream's failure is its own --------------------------------------------------
def two_upstreams(**settings: Any) -> tuple[Gateway, ControlLoop]:
    gateway = Gateway.build(Settings(upstreams=["http://a:8000", "http://b:8000"], **settings))
    return gateway, ControlLoop.build(gateway)


def counted(gateway: Gateway, name: str, **labels: str) -> float:
    return gateway.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_controller_that_raises_costs_its_upstream_the_tick_and_nobody_else(monkeypatch) -> None:
    gateway, loop = two_upstreams()
    ticked: list[str] = []

    def boom(*args: Any, **kwargs: Any) -> None:
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(loop.controls["http://a:8000"], "tick", boom)
    real = loop.controls["http://b:8000"].tick

    def spy(*args: Any, **kwargs: Any) -> Any:
        ticked.append("b")
        return real(*args, **kwargs)

    monkeypatch.setattr(loop.controls["http://b:8000"], "tick", spy)
    try:
        for _ in range(3):
            await loop.control()
        assert ticked == ["b", "b", "b"]
        assert counted(gateway, "sweetspot_controller_tick_errors_total", upstream="http://a:8000") == 3
        assert counted(gateway, "sweetspot_controller_tick_errors_total", upstream="http://b:8000") == 0
        assert gateway.pool.by_name["http://a:8000"].limiter.limit == gateway.settings.initial_limit  # held
    finally:
        await gateway.client.close()


async def test_an_exchange_that_raises_leaves_its_upstream_on_its_own_and_the_others_shared(monkeypatch) -> None:
    gateway, loop = two_upstreams()
    redis = FakeRedis()
    loop.board = loop.share_board("redis://unused", client=redis, replica="me:1", wall_clock=lambda: NOW)
    peer = loop.share_board("redis://unused", client=redis, replica="peer:2", wall_clock=lambda: NOW)
    for url in ("http://a:8000", "http://b:8000"):
        await peer.exchange(url, 40, 8)
    exchange = loop.board.exchange

    async def flaky(upstream: str, demand: float, limit: int) -> Peers | None:
        if upstream == "http://a:8000":
            raise RuntimeError("a bug in the exchange")
        return await exchange(upstream, demand, limit)

    monkeypatch.setattr(loop.board, "exchange", flaky)
    seen: dict[str, Peers | None] = {}
    real = loop.tick_one

    def spy(upstream: Any, control: Any, now: float, *, peers: Peers | None = None) -> Any:
        seen[upstream.name] = peers
        return real(upstream, control, now, peers=peers)

    monkeypatch.setattr(loop, "tick_one", spy)
    try:
        await loop.control()
        assert seen["http://a:8000"] is None
        b = seen["http://b:8000"]
        assert b is not None and b.replicas == 1 and b.demand == 40
    finally:
        await gateway.client.close()


async def test_poison_on_the_board_is_counted_and_never_stops_the_tick() -> None:
    """The issue's case end to end through the control loop: nan, an absurd demand, at=inf beside a real peer."""
    gateway, loop = two_upstreams()
    redis = FakeRedis()
    loop.board = loop.share_board("redis://unused", client=redis, replica="me:1", wall_clock=lambda: NOW)
    for url in ("http://a:8000", "http://b:8000"):
        redis.keys[loop.board.key(url)] = {
            b"peer:2": b"40 8 1700000000",
            b"evil:1": b"nan 8 1700000000",
            b"evil:2": b"1e12 8 1700000000",
            b"evil:3": b"12 8 inf",
        }
    try:
        await loop.control()
        for url in ("http://a:8000", "http://b:8000"):
            assert set(redis.keys[loop.board.key(url)]) == {b"me:1", b"peer:2"}
            assert (
                counted(gateway, "sweetspot_share_board_rejected_entries_total", upstream=url, reason="not_finite") == 2
            )
            assert (
                counted(gateway, "sweetspot_share_board_rejected_entries_total", upstream=url, reason="out_of_range")
                == 1
            )
            assert counted(gateway, "sweetspot_controller_tick_errors_total", upstream=url) == 0
            # every reason's series exists from the start, at 0, so rate() over it is 0 rather than no data
            assert (
                gateway.metrics.registry.get_sample_value(
                    "sweetspot_share_board_rejected_entries_total", {"upstream": url, "reason": "future"}
                )
                == 0.0
            )
    finally:
        await gateway.client.close()


async def test_redis_lost_is_no_peers_for_every_upstream_and_the_tick_goes_on() -> None:
    gateway, loop = two_upstreams()
    redis = FakeRedis()
    redis.down = True
    loop.board = loop.share_board("redis://unused", client=redis, replica="me:1", wall_clock=lambda: NOW)
    try:
        await loop.control()
        assert loop.board.failing
        for url in ("http://a:8000", "http://b:8000"):
            assert counted(gateway, "sweetspot_controller_tick_errors_total", upstream=url) == 0
            assert loop.controls[url].state()["decisions"]  # it stepped, on its own
    finally:
        await gateway.client.close()
