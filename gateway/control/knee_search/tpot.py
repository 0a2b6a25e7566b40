"""Predicting p99 TPOT at a limit from its throughput, before the limit's slow requests finish.

p99 TPOT is known only when requests finish, a whole request's life after the limit that caused it.
A step up past the latency objective would run that long unchecked. But throughput is read within
seconds, and limit / tokens-per-second is the mean time between two tokens of one stream (prefill
stalls included). Its ratio to the measured p99 TPOT is learned continuously, each p99 against the
per-slot rate its requests streamed at; a step's reading times that ratio predicts the step's p99 TPOT,
so an overshoot is undone at once.

A backend that gets slower at the same limit asks the same question the other way: its answers show the
slower tokens only once they end. :meth:`TpotPredictor.after_slowdown` answers it for
:mod:`gateway.control.knee_search.slowdown`.
"""

from __future__ import annotations

from gateway.control.knee_search.meter import LimitHistory
from gateway.control.knee_search.timed_mean import TimedMean
from gateway.control.observation import Observation

_WEIGHT = 0.3  # EWMA weight of a new calibration point
_KEEP_S = 600.0  # the longest request life the per-slot rates are kept for


class TpotPredictor:
    def __init__(self, min_samples: int) -> None:
        self.min_samples = min_samples
        self.scale: float | None = None  # p99 TPOT / (limit / tokens/s), learned
        self.judged: float | None = None  # the last p99 TPOT judged on min_samples requests or more
        self._history = LimitHistory()
        self._per_slot = TimedMean(_KEEP_S)  # tokens/s per slot, on bottleneck ticks

    def limit_set(self, now: float, limit: int) -> None:
        self._history.set(now, limit)

    def calibrate(self, obs: Observation, bottleneck: bool) -> None:
        """One calibration point from the window: its p99 TPOT times the per-slot token rate (tokens/s over
        the mean limit) that the window's finished requests streamed at. Only while the limit was the
        bottleneck: in-flight below the limit would make the per-slot rate look lower than it was.

        Those requests ran for their whole lives, not for the window: their per-slot rate is the mean over
        their lives (Little's law: the mean limit over the completions per second), so that after a step
        up the slower tokens of the new limit are not paired with p99 TPOT from requests that ran, mostly,
        at the old one. Paired so, the points would read low for an answer's life after every step up, and
        so would the next step's prediction, just where a TPOT cliff needs it right."""
        if obs.tpot_p99 is not None and obs.latency_samples >= self.min_samples:
            self.judged = obs.tpot_p99
        mean_limit = self._history.mean(obs.now - obs.window_s, obs.now)
        if not bottleneck or not mean_limit or obs.tokens_per_s <= 0:
            return
        self._per_slot.add(obs.now, obs.tokens_per_s / mean_limit)
        if obs.tpot_p99 is None or obs.latency_samples < self.min_samples:
            return
        lives = max(obs.window_s, mean_limit * obs.window_s / obs.completed) if obs.completed else obs.window_s
        during = self._per_slot.mean(obs.now - lives)
        assert during is not None, "the rate added above is within lives (at least window_s) of now"
        point = obs.tpot_p99 * during
        self.scale = point if self.scale is None else self.scale + _WEIGHT * (point - self.scale)

    def predict(self, limit: int, rate: float) -> float | None:
        """p99 TPOT expected at ``limit`` streaming ``rate`` tokens/s (None before calibration)."""
        if self.scale is None or rate <= 0:
            return None
        return self.scale * limit / rate

    def largest_within(self, objective: float, low: int, low_rate: float, high: int, high_rate: float) -> int:
        """The largest limit in [low, high) whose predicted p99 TPOT meets ``objective``, throughput
        read linearly between the two readings (``low`` when none does).

        ``low`` too when ``high`` streamed no more than ``low`` (past a cliff): its extra slots bought
        nothing, and the line's slope down would keep some of them over the cliff."""
        if high_rate <= low_rate:
            return low
        best = low
        for limit in range(low + 1, high):
            rate = low_rate + (high_rate - low_rate) * (limit - low) / (high - low)
            predicted = self.predict(limit, rate)
            if predicted is not None and predicted <= objective:
                best = limit
        return best

    def after_slowdown(self, factor: float) -> float | None:
        """p99 TPOT expected once every stream runs at ``factor`` (< 1) of the token rate it had when p99
        TPOT was last judged: each token comes 1/``factor`` times later (None before any judgement).

        Not :meth:`predict`: this needs no learned ratio, only the last judgement and the factor, so it holds
        from the first readings of the slower backend, while the ratio is an average over windows that
        straddle the change, and near a TPOT cliff an average a little short is over it
        (docs/controller.md, the AWQ slowdown)."""
        if self.judged is None or factor <= 0:
            return None
        return self.judged / factor
