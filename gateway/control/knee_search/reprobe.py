"""When the knee search measures beside the knee, and which way: the re-probe schedule.

Every period one step beside the knee is measured, alternately up and down; every third up-probe (and
the first after the curve was rescaled) is climb-sized, to keep the top of the curve fresh, since the
knee is measured against it. Where up is closed (the hard cap, a ceiling) the up-turn is skipped rather
than made a second down-probe.

A probe costs throughput while it lasts (a settle and two readings), so the schedule decides how much
of the backend's time goes to asking questions. Three rules keep that share small and useful:

* **Busy time.** The period is counted in time the limit was the bottleneck, not wall time: a probe
  can only be measured under demand, and on bursty demand a wall-clock schedule is always overdue when a
  burst starts, so every burst would pay for a probe (and a burst shorter than a probe never answers it).
* **Quiet at the hard cap.** At the hard cap (llama-server's slots) nothing lies above, so every probe
  is a down-probe asking one question: did the knee move below the cap? When the answer is a clear no
  (the point below measures under ``knee_fraction`` x (1 - the curve's shift) of the cap's throughput,
  so only a change the curve would call a change of the world could move the knee) the wait before the
  next probe doubles, up to ``QUIET_MAX`` periods. With a few slots one slot less costs a large share of
  the throughput, so a down-probe every two periods costs a lot for an answer already known
  (docs/controller.md, "Small limits", has llama-server's figures).
  A rescale of the curve, a congestion cut, the limit leaving the cap, or a down-probe whose point is
  no longer clearly worse brings the period back.
* **An abandoned probe waits its turn.** A probe whose demand went away before it was measured is
  abandoned (see :mod:`gateway.control.knee_search.aimd`); the next one, the exploratory step below an unbracketed
  knee included, waits a (quiet) period, and at the hard cap the wait doubles as for a confirmation:
  bursts shorter than a probe would otherwise pay for a new attempt each, and never get an answer.

Pure, like the rest of :mod:`gateway.control`: time comes in as a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.control.algorithm import Phase

QUIET_MAX = 8  # at most this many periods between probes at the hard cap (probes cost 1/8 as much)
CLIMB_EVERY = 3  # every third up-probe is climb-sized


@dataclass(slots=True)
class Probe:
    """A step being measured (any step the knee search takes, not only a re-probe)."""

    direction: int  # +1: slots added, -1: slots removed
    base_limit: int
    kind: Phase  # the phase that made the step
    interrupted: bool = False  # demand left while it waited for its reading


class Reprobe:
    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.busy_s = 0.0  # time the limit was the bottleneck, the schedule's clock
        self.next_at: float | None = None  # in busy time; None: scheduled at the next check
        self.direction = 1  # the next turn: +1 up, -1 down
        self.quiet = 1  # the period's multiplier at the hard cap (1, 2, 4 ... QUIET_MAX)
        self.waiting = False  # a probe was abandoned: the next one waits for the schedule
        self.up_probes = 0  # up-probes since the last climb-sized one
        self.reclimb = False  # the curve was just rescaled: climb-probe its top before any knee move
        self._last_now: float | None = None

    def tick(self, now: float, bottleneck: bool) -> None:
        """Advance the busy clock by the time since the last tick, if the limit was the bottleneck."""
        if bottleneck and self._last_now is not None and now > self._last_now:
            self.busy_s += now - self._last_now
        self._last_now = now

    def due(self, *, at_cap: bool) -> bool:
        """Whether the next probe is due; schedules one if none is (a quiet period only at the cap)."""
        if not at_cap:
            self.quiet = 1
        if self.next_at is None:
            self.next_at = self.busy_s + self.period_s * self.quiet
        return self.busy_s >= self.next_at - 1e-9

    def in_s(self) -> float | None:
        return None if self.next_at is None else round(self.next_at - self.busy_s, 1)

    def after(self, delay_s: float, *, direction: int | None = None) -> None:
        """The next probe ``delay_s`` of busy time from now (0: at the next check), and its direction;
        the limit moved for a reason of its own (a cut, a yield), so the period is back to one."""
        self.next_at = self.busy_s + delay_s
        self.waiting = False
        self.quiet = 1
        if direction is not None:
            self.direction = direction

    def begin(self) -> None:
        """A probe starts: the next one is scheduled once this one was judged."""
        self.next_at = None
        self.waiting = False

    def choose(self, limit: int, up: int, down: int, climb: int) -> tuple[int, bool] | None:
        """This turn's probe: its limit and whether it is climb-sized, or None to skip the turn (up is
        closed). ``up``, ``down`` and ``climb`` are the candidates, already bounded."""
        direction = self.direction
        self.direction = -direction
        if direction > 0 and up == limit:
            return None
        if (direction > 0 and up > limit) or down == limit:
            self.up_probes += 1
            if self.up_probes >= CLIMB_EVERY or self.reclimb:
                self.up_probes, self.reclimb = 0, False
                return climb, True
            target = up
        else:
            target = down
        return None if target == limit else (target, False)

    def rescaled(self, *, cruising: bool) -> None:
        """The curve was rescaled (the world changed): back to one period; when cruising, the top of
        the curve is measured again at once, by a climb-sized probe."""
        self.quiet = 1
        if cruising:
            self.after(0.0, direction=1)
            self.reclimb = True

    def answered(self, *, known: bool) -> None:
        """A down-probe from the hard cap was measured: ``known``, its point is still clearly worse."""
        if known:
            self.confirmed()
        else:
            self.reset()

    def confirmed(self) -> None:
        """A probe at the hard cap found the known answer: the next one waits twice as long."""
        self.quiet = min(self.quiet * 2, QUIET_MAX)

    def reset(self) -> None:
        """The world changed (or may have): back to one period."""
        self.quiet = 1

    def abandoned(self, *, at_cap: bool) -> None:
        """A probe lost its demand before its reading: the next one waits for the schedule."""
        if at_cap:
            self.confirmed()
        self.next_at = None
        self.due(at_cap=at_cap)
        self.waiting = True

    def state(self) -> dict[str, Any]:
        return {
            "next_probe_in_busy_s": self.in_s(),
            "next_direction": "up" if self.direction > 0 else "down",
            "busy_s": round(self.busy_s, 1),
            "quiet": self.quiet,
        }
