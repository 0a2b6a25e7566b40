"""The demand-weighted fair share of a backend that several gateway replicas feed.

Each replica judges slots by its own throughput, and its own throughput rises with its share of the
backend whatever the backend's total does, so replicas at their knees keep whatever split the race at
start-up gave them. From the backend's own metrics a replica sees how many requests run in all and how
many of them are its own, but not how many requests the *others* hold queued: the queues are in the
gateways. "They have little demand" and "they have much demand and small limits" look the same from
the backend, so with more than two replicas, or uneven demand, the fair split cannot be inferred; it
needs each replica's demand. :class:`Peers` is what the other replicas last published (shared state,
``gateway.server.share_board``), and :func:`fair_share` turns it into this replica's share of the
limits all replicas hold together, in proportion to demand: each waiting client gets the same share of
the backend whichever replica the load balancer sent it to.

The sum of the limits is still found by every replica's own knee search; this rule only moves slots
between replicas, so the sum stays where the searches put it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Outside this share of the fair share a replica moves to it (the scenarios' bound is 25%).
SHARE_SLACK = 0.15


@dataclass(frozen=True, slots=True)
class Entry:
    """One replica's numbers as it published them: its demand (in flight plus queued) and its limit."""

    demand: float
    limit: int
    at: float  # when it published them, on the reader's clock


@dataclass(frozen=True, slots=True)
class Peers:
    """The other replicas of the same upstream as they last published themselves: how many, their
    demand (in flight plus queued, summed), the limits they use (summed), and the oldest entry's age.

    A limit counts only up to its replica's demand: an idle replica's limit is no share of anything,
    and counting it would hand its slots to the busy ones twice over."""

    replicas: int
    demand: float
    limit: int
    age_s: float

    @classmethod
    def of(cls, entries: list[Entry], now: float) -> "Peers | None":
        if not entries:
            return None
        used = sum(min(e.limit, max(round(e.demand), 0)) for e in entries)
        return cls(len(entries), sum(e.demand for e in entries), used, max(now - min(e.at for e in entries), 0.0))


def _share(limit: int, demand: float, peers: Peers | None, stale_s: float) -> float | None:
    """This replica's demand-weighted part of all replicas' limits together, unrounded, or None when
    there is nothing to share: no peers, stale entries, no demand, or every replica's demand fits (no
    contention to split)."""
    if peers is None or peers.replicas <= 0 or peers.age_s > stale_s or demand <= 0:
        return None
    total_demand = demand + peers.demand
    total_limit = limit + peers.limit
    if total_demand <= total_limit:
        return None
    return total_limit * demand / total_demand


def fair_share(limit: int, demand: float, peers: Peers | None, stale_s: float) -> int | None:
    """This replica's demand-weighted share of all replicas' limits, rounded, or None when there is
    nothing to share (see :func:`_share`) or the limit is already within the slack."""
    share = _share(limit, demand, peers, stale_s)
    if share is None or abs(limit - share) <= SHARE_SLACK * share:
        return None
    return max(1, round(share))


def over_fair_share(limit: int, demand: float, peers: Peers | None, stale_s: float) -> bool:
    """Whether this replica holds more than its demand-weighted share of all replicas' limits while
    their demand exceeds what they hold together: then its own knee search does not take it higher. Its
    own throughput rises with any slot it adds, taken from the others or not, so by its own readings a
    step up from over its share pays, while it keeps a replica under its share (one that just joined)
    from growing into the room. At or under its share it searches as before, so the sum still moves."""
    share = _share(limit, demand, peers, stale_s)
    return share is not None and limit > share


def cap_share(hard_cap: int, demand: float, peers: Peers | None, stale_s: float) -> int:
    """This replica's part of the backend's hard cap (its slots, ``--max-num-seqs``): the cap is the
    backend's, not each replica's, so with peers known each holds its demand-weighted part of it,
    rounded down, so the parts never add up to more than the backend admits. A replica with no demand
    keeps one slot to notice demand with."""
    if peers is None or peers.replicas <= 0 or peers.age_s > stale_s:
        return hard_cap
    total = demand + peers.demand
    if total <= 0:
        return hard_cap
    return max(1, int(hard_cap * demand / total))


def share_move(limit: int, demand: float, peers: Peers | None, stale_s: float, *, lo: int, hi: int,
               bottleneck: bool, probing_up: bool, exploring: bool, room: int | None) -> int | None:
    """The limit this replica moves to for its demand-weighted share now, or None to leave it be.

    Up at once, and out of a step down that was exploring below it: a share is room the others leave,
    not a point on this replica's curve. Down only when the backend is full, where the slots given are
    the ones the others take (with room left, giving slots away would only follow another replica's
    exploratory step down; over its share, a replica with room yields a step at its next re-probe
    instead), or when this replica does not use its limit (slots it holds unused are slots another
    replica's clients queue for). ``room``: the KV cache's room for more requests (None: unknown);
    ``probing_up``/``exploring``: a step up, or any probe, is under way."""
    target = fair_share(limit, demand, peers, stale_s)
    if target is None:
        return None
    # Not held under this replica's ceiling: a step up to a share moves slots between replicas
    # and leaves the backend's total where it was; the ceiling is about the total.
    target = min(max(target, lo), hi)
    if target > limit:
        if not bottleneck:
            return None  # idle never moves the limit up
        if probing_up:
            return None  # a step up under way: judged first
        if room is not None:
            target = min(target, limit + max(room, 0))  # what the others left, not more
    elif bottleneck and (exploring or (room is not None and room > 0)):
        return None
    return None if target == limit else target
