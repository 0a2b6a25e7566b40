"""Replicas sharing a backend: one of them searches for the knee, the others move with it by demand.

Each replica that judged slots by its own throughput would see a step up pay whatever the backend's
total did, because the slots it adds are partly taken from the others: their sum settles well above one
gateway's knee, in whatever split the race at start-up gave. The backend's own metrics cannot fix the
split either: they show how many requests run in all, but not how many the *others* hold queued, so
with more than two replicas, or uneven demand, a fair split needs each replica's demand.

So with shared state (``gateway.server.feedback.share_board``) the replicas publish their demand (in flight
plus queued) and limit each tick, and :class:`Peers` carries the others' last entries. Of the replicas
whose limit binds (demand at or over it), the one with the lowest id *leads*: it searches for the knee
with its own readings, as a lone gateway does. Every other replica *follows*: its limit is the leader's,
scaled by demand (:func:`follow_target`), so each waiting client gets the same share of the backend
whichever replica the load balancer sent it to. Because everyone moves with the leader, a step the
leader measures is a step of the whole fleet, and its own throughput rises or falls in proportion to
the backend's: its curve is the backend's curve, seen through its share. Nobody needs to know N.

A leader that goes away (scaled down, killed) stops counting when its entry goes stale, and the next
lowest id leads; without shared state every replica searches on its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Entry:
    """One replica's numbers as it published them: its demand (in flight plus queued) and its limit."""

    demand: float
    limit: int
    at: float  # when it published them, on the reader's clock
    replica: str = ""  # its id: the order that picks the leader

    @property
    def binding(self) -> bool:
        """Its limit is what holds its clients back: a knee search there measures something."""
        return self.demand > 0 and self.demand >= self.limit


@dataclass(frozen=True, slots=True)
class Peers:
    """The other replicas of the same upstream as they last published themselves: how many, their
    demand (in flight plus queued, summed), the limits they use (summed), the oldest entry's age, and
    the leading replica's entry when another replica leads (None: this one leads, or nobody does).

    A limit counts only up to its replica's demand: an idle replica's limit is no share of anything,
    and counting it would hand its slots to the busy ones twice over."""

    replicas: int
    demand: float
    limit: int
    age_s: float
    leader: Entry | None = None

    @classmethod
    def of(cls, entries: list[Entry], now: float, me: Entry | None = None) -> Peers | None:
        """The others' ``entries`` as seen by ``me`` (this replica's own entry, for the leader's choice)."""
        if not entries:
            return None
        used = sum(min(e.limit, max(round(e.demand), 0)) for e in entries)
        candidates = [e for e in entries if e.binding] + ([me] if me is not None and me.binding else [])
        leader = min(candidates, key=lambda e: e.replica, default=None)
        return cls(
            len(entries),
            sum(e.demand for e in entries),
            used,
            max(now - min(e.at for e in entries), 0.0),
            None if leader is me else leader,
        )


def _known(peers: Peers | None, stale_s: float) -> bool:
    return peers is not None and peers.replicas > 0 and peers.age_s <= stale_s


def _contended(limit: int, demand: float, peers: Peers | None, stale_s: float) -> bool:
    """Fresh peers, demand here, and more demand in all than the replicas' limits hold: something to share."""
    if not _known(peers, stale_s) or demand <= 0:
        return False
    assert peers is not None
    return demand + peers.demand > limit + peers.limit


def follow_target(limit: int, demand: float, peers: Peers | None, stale_s: float) -> int | None:
    """The limit this replica moves to as a follower: the leader's limit scaled by this replica's demand
    over the leader's. None where this replica searches on its own: no fresh peers, it leads, it has no
    demand, or the replicas' demand fits their limits (nothing to share)."""
    if not _contended(limit, demand, peers, stale_s):
        return None
    assert peers is not None
    leader = peers.leader
    if leader is None:
        return None
    return max(1, round(leader.limit * demand / leader.demand))


def leading(limit: int, demand: float, peers: Peers | None, stale_s: float) -> float | None:
    """This replica's part of all replicas' demand while it leads them (fresh peers, none of them the
    leader, and more demand than limits), or None. The leader's limit stands for the fleet's limit
    times this part, so when the part changes (a replica joins or leaves, demand shifts), the same
    limit means another fleet."""
    if not _contended(limit, demand, peers, stale_s):
        return None
    assert peers is not None
    if peers.leader is not None:
        return None
    return demand / (demand + peers.demand)


def _fraction(demand: float, peers: Peers | None, stale_s: float) -> float | None:
    """This replica's part of all replicas' demand, or None alone, with stale peers, or with no demand."""
    if not _known(peers, stale_s):
        return None
    assert peers is not None
    everyone = demand + peers.demand
    return None if everyone <= 0 else demand / everyone


def cap_share(hard_cap: int, demand: float, peers: Peers | None, stale_s: float) -> int:
    """This replica's part of the backend's hard cap (its slots, ``--max-num-seqs``): the cap is the
    backend's, not each replica's, so with peers known each holds its demand-weighted part of it,
    rounded down, so the parts never add up to more than the backend admits. A replica with no demand
    keeps one slot to notice demand with."""
    fraction = _fraction(demand, peers, stale_s)
    return hard_cap if fraction is None else max(1, int(hard_cap * fraction))


def room_share(room: int, demand: float, peers: Peers | None, stale_s: float) -> int:
    """This replica's demand-weighted part of the KV cache's room for more requests, rounded down: the
    room is the backend's, and every replica that steps up takes from it."""
    fraction = _fraction(demand, peers, stale_s)
    return room if fraction is None or room <= 0 else int(room * fraction)
