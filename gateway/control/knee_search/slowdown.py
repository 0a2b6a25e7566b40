"""A backend that got slower at the same limit: cut to the TPOT objective when the readings show it, and back
once they show the old speed.

A throttled GPU, a co-tenant or a heavier mix shows in two settled readings far under what the curve expects,
which rescale the curve by their factor f (:class:`~gateway.control.knee_search.curve.Rescale`). The answers
running then show the slower tokens only when they end, an answer's life later; on a deployment whose goodput
ends at a TPOT cliff, that cliff moves with the speed (the matrix's AWQ deployment: 59 at full speed, 27 at
half), so a cut judged on finished requests comes after a slower phase of a few minutes has lost its goodput.
The last p99 TPOT judged, over f, is what the running answers will show
(:meth:`~gateway.control.knee_search.tpot.TpotPredictor.after_slowdown`).

The way back is read against the curve from before the rescale, not the slower one: once a settled reading at
the lower limit is what the backend gave there before, the limit returns to where it was, under that curve.
Returning the limit alone is not enough: the knee read off the slower backend's readings would send it back
down (docs/controller.md, "A backend that gets slower").
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.control.knee_search.curve import Curve, Rescale
from gateway.control.knee_search.tpot import TpotPredictor


@dataclass(frozen=True, slots=True)
class SlowdownCut:
    """A cut made for a slower backend: the limit before it, and the rescale that showed the slowdown."""

    limit_before: int
    rescale: Rescale


class Slowdown:
    """The cut in force, if any, and the two questions asked of it: where to cut, and whether the backend is back."""

    __slots__ = ("cut",)

    def __init__(self) -> None:
        self.cut: SlowdownCut | None = None

    def cut_to(
        self, limit: int, lo: int, curve: Curve, tpot: TpotPredictor, objective: float | None
    ) -> tuple[int, float] | None:
        """Right after ``curve`` rescaled: the limit that meets the TPOT ``objective`` at the new speed and the p99
        TPOT predicted there without a cut, or None where no cut is called for. A cut needs the prediction over
        the objective by more than the curve's shift: f comes from one reading and carries a reading's noise."""
        rescale = curve.last_rescale
        if rescale is None or rescale.factor >= 1 or objective is None:
            return None
        predicted = tpot.after_slowdown(rescale.factor)
        if predicted is None or predicted <= objective * (1 + curve.shift):
            return None
        target = max(lo, int(limit * objective / predicted))  # TPOT read as proportional to the streams running
        if target >= limit:
            return None
        self.cut = SlowdownCut(limit, rescale)
        return target, predicted

    def recovered(self, limit: int, rate: float) -> SlowdownCut | None:
        """The cut, taken off, once a settled reading of ``rate`` at ``limit`` is what the backend gave there
        before the slowdown; None while it is not (or there is no cut)."""
        cut = self.cut
        if cut is None or not cut.rescale.back(limit, rate):
            return None
        self.cut = None
        return cut

    def cancel(self) -> None:
        """Forget the cut: the limit before it no longer stands (it would run out of room, or counts another unit)."""
        self.cut = None

    def state(self) -> dict[str, float] | None:
        cut = self.cut
        return None if cut is None else {"return_to": cut.limit_before, "speed": round(cut.rescale.factor, 3)}
