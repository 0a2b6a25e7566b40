"""The throughput curve the controller has measured: tokens/s at each limit it held.

One reading is a few seconds of throughput at one limit, and a few seconds of an LLM backend are
noisy (each new request's prefill stalls the batch): a reading's noise is of the order of the whole top
of a typical curve, from the sweet spot to the cliff (docs/controller.md, "Measuring throughput at a
limit", has the figures). A single probe's gain is therefore no evidence; the curve pools every reading
per limit (a running mean that still follows drift) and the knee is read off the whole curve, not off one
comparison.

A reading far from what the curve expects (the same limit's mean, or for a new limit the range its
neighbours allow) means the world changed. Two such readings in a row, in the same direction, rescale
every older reading by the same factor: a backend that got uniformly slower or faster (a throttled
GPU, a co-tenant, a recovery) keeps the shape of its curve, and so its knee.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

MAX_WEIGHT = 6  # the running mean weighs at most this many readings, so it keeps following drift
_PROVISIONAL_BELOW = 0.8  # first readings count only below this share of the lowest settled limit


@dataclass(slots=True)
class Point:
    mean: float
    weight: float
    count: int
    at: float  # when the point's last reading started
    settled: bool  # False while the point holds only first readings after a change


@dataclass(frozen=True, slots=True)
class Rescale:
    """The curve's last rescale: the factor readings showed (the new rate over the expected one) and the
    curve as it was before, the backend's speed up to then."""

    factor: float
    before: Curve

    def back(self, limit: int, rate: float) -> bool:
        """Whether a settled reading at ``limit`` is what the backend gave there before the rescale (within
        the curve's shift, or above): the world the rescale left is back."""
        return not self.before.short_of(limit, rate)


class Curve:
    def __init__(self, shift: float = 0.12) -> None:
        self.shift = shift  # relative deviation from expectation that means "the world changed"
        self.points: dict[int, Point] = {}
        self.last_rescale: Rescale | None = None
        self._deviation = 0  # consecutive deviating settled readings, signed by direction
        self._normal_at = -math.inf  # when the last settled reading the curve expected started

    def _expected(self, limit: int) -> tuple[float, float, float] | None:
        """(low, mid, high) of what a reading at ``limit`` should be, from the curve as it is."""
        point = self.points.get(limit)
        if point is not None and point.settled:
            return (1 - self.shift) * point.mean, point.mean, (1 + self.shift) * point.mean
        return self._expected_from_neighbours(limit)

    def _expected_from_neighbours(self, limit: int) -> tuple[float, float, float] | None:
        settled = sorted((key, p.mean) for key, p in self.points.items() if p.settled and key != limit)
        below = [(key, mean) for key, mean in settled if key < limit]
        above = [(key, mean) for key, mean in settled if key > limit]
        if below and above:  # between two readings: the curve rises (or plateaus) between them
            (lk, lm), (hk, hm) = below[-1], above[0]
            mid = lm + (hm - lm) * (limit - lk) / (hk - lk)
            return (1 - self.shift) * min(lm, hm), mid, (1 + self.shift) * max(lm, hm)
        if below:  # above the range: no lower than the top reading, at most proportionally higher
            key, mean = below[-1]
            return (1 - self.shift) * mean, mean, (1 + self.shift) * mean * limit / key
        if above:  # below the range: at most the lowest reading, at least proportionally lower
            key, mean = above[0]
            return (1 - self.shift) * mean * limit / key, mean * limit / key, (1 + self.shift) * mean
        return None

    def add(self, limit: int, rate: float, now: float, *, settled: bool = True) -> bool:
        """Record one reading that started at ``now``; returns True when it rescaled the curve.

        A reading taken right after a change (``settled=False``) is biased: the requests admitted
        together run in step, so their prefills are all behind them and the next seconds are pure
        decoding (a few percent fast after an increase). It stands in for a limit only until a
        settled reading replaces it, and never moves the curve."""
        if settled:
            expected = self._expected(limit)
            if expected is not None and not expected[0] <= rate <= expected[2]:
                direction = 1 if rate > expected[2] else -1
                if self._deviation * direction <= 0:
                    self._deviation = 0
                self._deviation += direction
                if abs(self._deviation) < 2:
                    return False  # one reading can be a transient: a prefill burst, a recompute
                # The readings that revealed the change straddle it (requests of the old mix still
                # finishing): they give the factor, and the curve, this limit's point included, is
                # measured again from here on. First readings since the last expected one may have
                # seen either world, so they are dropped rather than scaled.
                factor = rate / expected[1]
                self.last_rescale = Rescale(factor, self.copy())
                self.points = {key: p for key, p in self.points.items() if p.settled or p.at <= self._normal_at}
                self.rescale(factor, before=now + 1)
                self._deviation = 0
                return True
            self._deviation = 0
            self._normal_at = max(self._normal_at, now)
        point = self.points.get(limit)
        if point is None or (settled and not point.settled):
            self.points[limit] = Point(rate, 1.0, 1, now, settled)
            return False
        if not settled and point.settled:
            return False
        kept = min(point.weight, MAX_WEIGHT - 1.0)
        point.mean = (point.mean * kept + rate) / (kept + 1.0)
        point.weight = kept + 1.0
        point.count += 1
        point.at = now
        return False

    def rescale(self, factor: float, *, before: float = math.inf) -> None:
        """Scale every reading taken before ``before`` (those after it already saw the new backend).
        Scaled readings count as first readings: they stand in until readings at their limits come
        in, and near settled readings they give way (a mix shift changes the shape too, not only the
        scale, so the old top must not decide where the new knee is)."""
        for point in self.points.values():
            if point.at < before:
                point.mean *= factor
                point.weight = min(point.weight, 1.0)
                point.settled = False

    def short_of(self, limit: int, rate: float) -> bool:
        """Whether a reading at ``limit`` falls under what the curve expects there by more than its shift
        (False where it expects nothing)."""
        expected = self._expected(limit)
        return expected is not None and rate < expected[0]

    def copy(self) -> Curve:
        """The same readings, in a curve of their own (without its record of rescales)."""
        copied = Curve(self.shift)
        copied.points = {limit: replace(point) for limit, point in self.points.items()}
        copied._normal_at = self._normal_at
        return copied

    def settled(self, limit: int) -> bool:
        point = self.points.get(limit)
        return point is not None and point.settled

    def weight(self, limit: int) -> float:
        """How many settled readings the point at ``limit`` pools (0 for none)."""
        point = self.points.get(limit)
        return point.weight if point is not None and point.settled else 0.0

    def rate(self, limit: int) -> float | None:
        point = self.points.get(limit)
        return None if point is None else point.mean

    def _usable(self) -> dict[int, Point]:
        """Settled points, plus first readings well below the lowest settled one: slow start's
        doublings pass the steep part of the curve once, and nothing replaces those readings, but
        near settled ones a first reading's bias would only distort them."""
        settled = [limit for limit, point in self.points.items() if point.settled]
        if not settled:
            return dict(self.points)
        below = _PROVISIONAL_BELOW * min(settled)
        return {limit: point for limit, point in self.points.items() if point.settled or limit < below}

    def fitted(self) -> list[tuple[int, float]]:
        """The usable readings made non-decreasing by pooling neighbours that contradict it (isotonic
        regression, pool-adjacent-violators, weighted by how many readings each point holds).

        Below the cliff, throughput never falls as the limit rises; where readings say otherwise it
        is noise, and pooling them is what averages the noise out of the flat top of the curve. The
        best is then the plateau's mean, not the luckiest reading on it."""
        usable = self._usable()
        blocks: list[list[float]] = []  # [weighted sum, weight, first index, last index]
        limits = sorted(usable)
        for i, limit in enumerate(limits):
            point = usable[limit]
            weight = point.weight if point.settled else 0.5
            blocks.append([point.mean * weight, weight, i, i])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                total, weight, first, _ = blocks.pop(-2)
                blocks[-1] = [blocks[-1][0] + total, blocks[-1][1] + weight, first, blocks[-1][3]]
        fitted: list[tuple[int, float]] = []
        for total, weight, first, last in blocks:
            fitted.extend((limits[i], total / weight) for i in range(int(first), int(last) + 1))
        return fitted

    def best(self) -> tuple[int, float] | None:
        """The smallest limit at the fitted curve's highest throughput, and that throughput."""
        fitted = self.fitted()
        if not fitted:
            return None
        top = fitted[-1][1]
        return next(limit for limit, rate in fitted if rate >= top), top

    def knee(self, fraction: float) -> tuple[int, bool] | None:
        """The smallest limit whose fitted throughput reaches ``fraction`` of the best (rounded up;
        see :func:`_crossing` for how the curve is read between measured limits), and whether a
        measured limit below it falls short (False: the knee may lie further down, unmeasured)."""
        fitted = self.fitted()
        if not fitted:
            return None
        threshold = fraction * fitted[-1][1]
        previous: tuple[int, float] | None = None
        for limit, rate in fitted:
            if rate >= threshold:
                if previous is None:
                    return limit, False
                low, low_rate = previous
                if rate <= low_rate or low_rate <= 0:
                    return limit, True
                return math.ceil(_crossing(low, low_rate, limit, rate, threshold) - 1e-9), True
            previous = (limit, rate)
        return fitted[-1][0], True

    def measured_around(self, limit: int) -> bool:
        """Whether settled readings lie on both sides of ``limit`` (or at it): an estimate there is
        read between measurements, not off a first reading whose bias (or slow start's single pass)
        may have put it far from where the curve really is."""
        settled = [key for key, point in self.points.items() if point.settled]
        return any(key <= limit for key in settled) and any(key >= limit for key in settled)

    def seed(self, levels: Iterable[tuple[int, float]]) -> None:
        """Start from readings measured elsewhere (a sweep): settled points of one reading each, taken
        before any local one (so any rescale scales them), which the first local readings at their
        limits outweigh."""
        for limit, rate in levels:
            if limit >= 1 and rate > 0:
                self.points[limit] = Point(rate, 1.0, 1, -math.inf, True)

    def forget_above(self, limit: int) -> None:
        """Drop readings at limits above ``limit`` (they ran into congestion: not attainable)."""
        self.points = {key: point for key, point in self.points.items() if key <= limit}

    def regroup(self, factor: float) -> None:
        """Scale every reading's limit and throughput by ``factor``: this gateway's part of a backend it
        shares changed, and a limit of it now stands for the backend's level ``factor`` times lower,
        where its part of the same throughput is ``factor`` times larger. Readings landing on one limit
        pool by weight."""
        points: dict[int, Point] = {}
        for key, point in sorted(self.points.items()):
            new_key = max(1, round(key * factor))
            scaled = Point(point.mean * factor, point.weight, point.count, point.at, point.settled)
            have = points.get(new_key)
            if have is None or (scaled.settled and not have.settled):
                points[new_key] = scaled
            elif scaled.settled or not have.settled:
                weight = have.weight + scaled.weight
                have.mean = (have.mean * have.weight + scaled.mean * scaled.weight) / weight
                have.weight = min(weight, float(MAX_WEIGHT))
                have.count += scaled.count
                have.at = max(have.at, scaled.at)
        self.points = points

    def clear(self) -> None:
        self.points = {}

    def as_dict(self) -> dict[str, float]:
        """Limit -> tokens/s; limits known only from a first reading carry a ``~``."""
        return {
            f"{limit}{'' if self.points[limit].settled else '~'}": round(self.points[limit].mean, 1)
            for limit in sorted(self.points)
        }


def _crossing(low: int, low_rate: float, high: int, high_rate: float, threshold: float) -> float:
    """Where the curve between two readings reaches ``threshold``, reading it as a batching server
    behaves: each stream's time per token grows linearly with the number of streams between the two
    (memory-bound steps that turn compute-bound), so throughput L / (a + b L) is concave between
    them. A straight line between the readings would lie under that curve and put the knee late."""
    tau_low, tau_high = low / low_rate, high / high_rate
    slope = (tau_high - tau_low) / (high - low)
    denominator = 1 - threshold * slope
    if denominator <= 0:
        return float(high)
    return min(max(threshold * (tau_low - slope * low) / denominator, float(low)), float(high))
