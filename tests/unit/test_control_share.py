"""Replicas sharing a backend (``gateway.control.share``): the lowest-id replica whose limit binds leads
the knee search, the others follow its limit scaled by demand, and the algorithm moves accordingly."""

from __future__ import annotations

from dataclasses import replace

from gateway.control.algorithm import Action, Reason
from gateway.control.config import AimdConfig
from gateway.control.knee_search.aimd import Aimd
from gateway.control.knee_search.curve import Curve
from gateway.control.observation import LimiterState, Observation, observe
from gateway.control.share import Entry, Peers, cap_share, follow_target, leading, room_share
from gateway.control.window import SlidingWindow

CONFIG = AimdConfig()


def _peers(*entries: Entry, me: Entry, now: float = 10.0) -> Peers:
    peers = Peers.of(list(entries), now, me)
    assert peers is not None
    return peers


def test_the_lowest_id_whose_limit_binds_leads() -> None:
    a, b, c = Entry(20, 10, 9.5, "a"), Entry(20, 10, 9.5, "b"), Entry(20, 10, 9.5, "c")
    assert _peers(a, c, me=b).leader == a
    assert _peers(b, c, me=a).leader is None  # this replica leads
    idle_a = Entry(3, 10, 9.5, "a")  # its limit does not bind: its search would measure nothing
    assert _peers(idle_a, c, me=b).leader is None
    assert _peers(idle_a, me=replace(b, demand=0)).leader is None  # nobody's limit binds
    assert _peers(idle_a, c, me=replace(b, demand=0)).leader == c


def test_an_idle_replica_limit_is_no_share() -> None:
    peers = Peers.of([Entry(0, 8, 9.0), Entry(40, 20, 9.5), Entry(5, 12, 10.0)], now=10.0)
    assert peers is not None
    assert (peers.replicas, peers.demand, peers.limit) == (3, 45, 25)  # 0 + 20 + 5 slots in use
    assert peers.age_s == 1.0
    assert Peers.of([], now=1.0) is None


def test_a_follower_takes_the_leaders_limit_scaled_by_demand() -> None:
    leader = Entry(20, 10, 9.5, "a")
    # 60 clients here against the leader's 20: three times its limit
    assert follow_target(8, 60, _peers(leader, me=Entry(60, 8, 10.0, "b")), stale_s=10) == 30
    # seven replicas of 10 clients each beside a leader at 5: 5 each
    peers = Peers(7, 70, 35, 1.0, Entry(10, 5, 9.0, "a"))
    assert follow_target(12, 10, peers, stale_s=10) == 5


def test_no_following_when_leading_alone_stale_idle_or_uncontended() -> None:
    leader = Entry(20, 10, 9.5, "a")
    assert follow_target(8, 20, None, stale_s=10) is None
    assert follow_target(8, 20, Peers(1, 20, 10, 11.0, leader), stale_s=10) is None  # stale
    assert follow_target(8, 0, Peers(1, 20, 10, 1.0, leader), stale_s=10) is None  # no demand here
    assert follow_target(8, 20, Peers(1, 20, 10, 1.0, None), stale_s=10) is None  # it leads
    assert follow_target(30, 5, Peers(1, 20, 20, 1.0, leader), stale_s=10) is None  # every demand fits


def test_the_leaders_part_of_the_demand() -> None:
    assert leading(10, 20, Peers(3, 60, 30, 1.0, None), stale_s=10) == 0.25
    assert leading(10, 20, Peers(3, 60, 30, 1.0, Entry(20, 10, 9.0, "a")), stale_s=10) is None  # follows
    assert leading(10, 20, Peers(3, 60, 30, 11.0, None), stale_s=10) is None  # stale: alone
    assert leading(40, 20, Peers(1, 5, 5, 1.0, None), stale_s=10) is None  # every demand fits


def test_replicas_split_the_backends_hard_cap_and_kv_room_by_demand_never_above_them() -> None:
    assert cap_share(6, 8, None, stale_s=10) == 6  # alone: the whole cap
    parts = [cap_share(6, 8, Peers(2, 16, 4, 1.0), stale_s=10) for _ in range(3)]
    assert parts == [2, 2, 2]
    assert cap_share(6, 6, Peers(1, 2, 2, 1.0), stale_s=10) + cap_share(6, 2, Peers(1, 6, 4, 1.0), stale_s=10) <= 6
    assert cap_share(6, 0, Peers(1, 20, 6, 1.0), stale_s=10) == 1  # idle: one slot to notice demand with
    assert cap_share(6, 8, Peers(2, 16, 4, 11.0), stale_s=10) == 6  # stale peers: on its own
    assert room_share(9, 10, Peers(2, 20, 10, 1.0), stale_s=10) == 3
    assert room_share(0, 10, Peers(2, 20, 10, 1.0), stale_s=10) == 0  # no room is nobody's room
    assert room_share(9, 10, None, stale_s=10) == 9


def _obs(now: float, limit: int, *, clients: int, kv: float, running: int, peers: Peers | None) -> Observation:
    inflight = min(limit, clients)
    return replace(
        observe(now, SlidingWindow(10.0).stats(now), LimiterState(limit, inflight, inflight, max(clients - limit, 0))),
        kv_usage=kv,
        kv_usage_age_s=0.5,
        backend_running=running,
        backend_running_age_s=0.5,
        peers=peers,
    )


def test_a_follower_moves_with_the_leader_up_and_down_and_searches_nothing() -> None:
    aimd = Aimd(CONFIG, initial_limit=8)
    up = aimd.step(_obs(2.0, 8, clients=40, kv=0.2, running=30, peers=Peers(1, 40, 22, 0.5, Entry(40, 22, 1.9, "a"))))
    assert up.reason is Reason.FOLLOW and up.limit == 22
    held = aimd.step(
        _obs(4.0, 22, clients=40, kv=0.2, running=44, peers=Peers(1, 40, 22, 0.5, Entry(40, 22, 3.9, "a")))
    )
    assert held.reason is Reason.FOLLOW and held.action is Action.HOLD
    # the leader's exploratory step down is followed at once: it measures the whole fleet there
    down = aimd.step(
        _obs(6.0, 22, clients=40, kv=0.2, running=44, peers=Peers(1, 40, 16, 0.5, Entry(40, 16, 5.9, "a")))
    )
    assert down.reason is Reason.FOLLOW and down.limit == 16


def test_a_followers_step_up_stops_at_its_part_of_the_room_left() -> None:
    aimd = Aimd(CONFIG, initial_limit=8)
    # KV 0.85 with 30 running: room for floor(0.75 * 0.05 / (0.85 / 30)) = 1 more; its part of 1 is 0
    decision = aimd.step(
        _obs(2.0, 8, clients=40, kv=0.85, running=30, peers=Peers(1, 40, 22, 0.5, Entry(40, 22, 1.9, "a")))
    )
    assert decision.reason is Reason.FOLLOW and decision.limit == 8


def test_a_follower_that_does_not_use_its_limit_comes_down_to_its_part() -> None:
    """Slots a replica holds unused are slots the other replicas' clients queue for: 4 clients beside
    the leader's 40 at 22 get 22 x 4 / 40 = 2.2 of them."""
    aimd = Aimd(CONFIG, initial_limit=8)
    obs = replace(
        _obs(2.0, 8, clients=4, kv=0.5, running=30, peers=Peers(1, 40, 22, 0.5, Entry(40, 22, 1.9, "a"))),
        queue_depth=0,
        peak_inflight=4,
    )
    decision = aimd.step(obs)
    assert decision.reason is Reason.FOLLOW and decision.limit == 2


def test_a_leader_whose_part_of_the_demand_moves_keeps_the_fleets_limit() -> None:
    """A third replica joins two: the leader's part of the demand falls from 1/2 to 1/3, so the same
    fleet limit is two thirds of its own limit, and its curve's readings move with it."""
    aimd = Aimd(CONFIG, initial_limit=18)
    first = aimd.step(_obs(2.0, 18, clients=40, kv=0.5, running=36, peers=Peers(1, 40, 18, 0.5)))
    assert first.reason is not Reason.FOLLOW and first.limit == 18  # its part is taken: 1/2
    aimd._curve.points.clear()
    aimd._curve.seed([(18, 600.0)])
    regrouped = aimd.step(_obs(4.0, 18, clients=20, kv=0.5, running=36, peers=Peers(2, 40, 27, 0.5)))
    assert regrouped.reason is Reason.FOLLOW and regrouped.limit == 12
    assert aimd._curve.as_dict() == {"12": 400.0}


def test_a_curve_regroups_its_limits_and_readings() -> None:
    curve = Curve()
    curve.seed([(16, 500.0), (18, 540.0), (20, 550.0)])
    curve.regroup(0.5)
    assert curve.as_dict() == {"8": 250.0, "9": 270.0, "10": 275.0}
    curve.regroup(1 / 3)  # 8 -> 3, 9 -> 3, 10 -> 3: pooled by weight
    assert curve.as_dict() == {"3": round((250.0 + 270.0 + 275.0) / 3 / 3, 1)}


def test_with_the_others_known_a_replica_never_yields_a_step() -> None:
    """``capacity.over_share`` is the two-gateway guess from the backend's metrics; with the others'
    numbers known, the leader sizes the fleet and demand splits it."""
    aimd = Aimd(CONFIG, initial_limit=30)
    decision = aimd.step(_obs(2.0, 30, clients=40, kv=0.93, running=40, peers=Peers(1, 40, 10, 0.5)))
    assert decision.reason is not Reason.FAIR_SHARE


def test_a_replica_over_its_part_of_the_hard_cap_comes_down_to_it() -> None:
    aimd = Aimd(CONFIG, initial_limit=6)
    obs = replace(_obs(2.0, 6, clients=8, kv=0.5, running=6, peers=Peers(2, 16, 12, 0.5)), hard_cap=6)
    decision = aimd.step(obs)
    assert decision.limit == 2 and decision.reason is Reason.HARD_CAP
