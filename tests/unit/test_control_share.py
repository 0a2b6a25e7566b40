"""The demand-weighted fair share between replicas (``gateway.control.share``), and how the algorithm
moves to it: up at once when the others left room, down only on a full backend or when unused."""

from __future__ import annotations

from dataclasses import replace

from gateway.control.aimd import Aimd
from gateway.control.algorithm import Reason
from gateway.control.config import AimdConfig
from gateway.control.observation import LimiterState, Observation, observe
from gateway.control.share import Entry, Peers, fair_share, over_fair_share
from gateway.control.window import SlidingWindow

CONFIG = AimdConfig()


def test_the_share_follows_demand_not_the_number_of_replicas() -> None:
    # 60 of 80 waiting clients here, 40 slots in all: 30 are this replica's
    assert fair_share(10, 60, Peers(1, 20, 30, 1.0), stale_s=10) == 30
    assert fair_share(30, 20, Peers(1, 60, 10, 1.0), stale_s=10) == 10
    # seven others with 10 clients each, 40 slots in all: 5 each
    assert fair_share(12, 10, Peers(7, 70, 28, 1.0), stale_s=10) == 5


def test_no_share_without_contention_or_fresh_peers() -> None:
    assert fair_share(10, 60, None, stale_s=10) is None
    assert fair_share(10, 60, Peers(1, 20, 30, 11.0), stale_s=10) is None  # stale entries
    assert fair_share(10, 0, Peers(1, 20, 30, 1.0), stale_s=10) is None  # no demand here
    assert fair_share(20, 10, Peers(1, 10, 20, 1.0), stale_s=10) is None  # every demand fits its limit
    assert fair_share(20, 40, Peers(1, 40, 19, 1.0), stale_s=10) is None  # within the slack


def test_over_its_share_a_replica_searches_no_higher() -> None:
    # 40 of 80 clients here, 12 + 10 slots in all: a share of 11
    assert over_fair_share(12, 40, Peers(1, 40, 10, 1.0), stale_s=10)
    assert not over_fair_share(11, 40, Peers(1, 40, 11, 1.0), stale_s=10)  # at its share: the sum may still move
    assert not over_fair_share(10, 40, Peers(1, 40, 12, 1.0), stale_s=10)
    assert not over_fair_share(12, 40, Peers(1, 40, 10, 11.0), stale_s=10)  # stale entries: on its own
    assert not over_fair_share(30, 20, Peers(1, 10, 20, 1.0), stale_s=10)  # every demand fits its limit


def test_an_idle_replica_limit_is_no_share() -> None:
    peers = Peers.of([Entry(0, 8, 9.0), Entry(40, 20, 9.5), Entry(5, 12, 10.0)], now=10.0)
    assert peers is not None
    assert (peers.replicas, peers.demand, peers.limit) == (3, 45, 25)  # 0 + 20 + 5 slots in use
    assert peers.age_s == 1.0
    assert Peers.of([], now=1.0) is None


def _obs(now: float, limit: int, *, clients: int, kv: float, running: int, peers: Peers | None) -> Observation:
    inflight = min(limit, clients)
    return replace(
        observe(now, SlidingWindow(10.0).stats(now), LimiterState(limit, inflight, inflight, max(clients - limit, 0))),
        kv_usage=kv, kv_usage_age_s=0.5, backend_running=running, backend_running_age_s=0.5, peers=peers,
    )


def test_under_its_share_a_replica_takes_the_room_the_others_left() -> None:
    aimd = Aimd(CONFIG, initial_limit=8)
    decision = aimd.step(_obs(2.0, 8, clients=40, kv=0.5, running=30, peers=Peers(1, 40, 22, 0.5)))
    assert decision.reason is Reason.FAIR_SHARE and decision.limit == 15  # half of 30


def test_the_step_up_to_a_share_stops_at_the_room_left() -> None:
    aimd = Aimd(CONFIG, initial_limit=8)
    # KV 0.85 with 30 running: room for floor(0.75 * 0.05 / (0.85 / 30)) = 1 more
    decision = aimd.step(_obs(2.0, 8, clients=40, kv=0.85, running=30, peers=Peers(1, 40, 22, 0.5)))
    assert decision.reason is Reason.FAIR_SHARE and decision.limit == 9


def test_over_its_share_a_replica_gives_slots_back_only_on_a_full_backend() -> None:
    peers = Peers(1, 40, 10, 0.5)
    with_room = Aimd(CONFIG, initial_limit=30)
    decision = with_room.step(_obs(2.0, 30, clients=40, kv=0.5, running=40, peers=peers))
    assert decision.reason is not Reason.FAIR_SHARE and decision.limit >= 30
    full = Aimd(CONFIG, initial_limit=30)
    decision = full.step(_obs(2.0, 30, clients=40, kv=0.93, running=40, peers=peers))
    assert decision.reason is Reason.FAIR_SHARE and decision.limit == 20


def test_an_unused_limit_over_its_share_is_given_back() -> None:
    peers = Peers(1, 60, 20, 0.5)
    unused = Aimd(CONFIG, initial_limit=22)
    decision = unused.step(_obs(2.0, 22, clients=20, kv=0.5, running=40, peers=peers))
    assert decision.reason is Reason.FAIR_SHARE and decision.limit == 10  # 42 x 20 / 80 = 10.5


def test_a_share_move_waits_a_window_before_the_next() -> None:
    aimd = Aimd(CONFIG, initial_limit=8)
    peers = Peers(1, 40, 22, 0.5)
    first = aimd.step(_obs(2.0, 8, clients=40, kv=0.5, running=30, peers=peers))
    second = aimd.step(_obs(4.0, first.limit, clients=40, kv=0.5, running=30, peers=Peers(1, 40, 40, 0.5)))
    assert first.reason is Reason.FAIR_SHARE
    assert second.reason is not Reason.FAIR_SHARE


def test_replicas_split_the_backends_hard_cap_by_demand_never_above_it() -> None:
    from gateway.control.share import cap_share

    assert cap_share(6, 8, None, stale_s=10) == 6  # alone: the whole cap
    parts = [cap_share(6, 8, Peers(2, 16, 4, 1.0), stale_s=10) for _ in range(3)]
    assert parts == [2, 2, 2]
    assert cap_share(6, 6, Peers(1, 2, 2, 1.0), stale_s=10) + cap_share(6, 2, Peers(1, 6, 4, 1.0), stale_s=10) <= 6
    assert cap_share(6, 0, Peers(1, 20, 6, 1.0), stale_s=10) == 1  # idle: one slot to notice demand with
    assert cap_share(6, 8, Peers(2, 16, 4, 11.0), stale_s=10) == 6  # stale peers: on its own


def test_a_replica_over_its_part_of_the_hard_cap_comes_down_to_it() -> None:
    aimd = Aimd(CONFIG, initial_limit=6)
    obs = replace(_obs(2.0, 6, clients=8, kv=0.5, running=6, peers=Peers(2, 16, 12, 0.5)), hard_cap=6)
    decision = aimd.step(obs)
    assert decision.limit == 2 and decision.reason is Reason.HARD_CAP
