"""What every baseline shares: turning a limit change into a :class:`Decision`, and a request's RTT.

The baselines speak their own references' language (queue estimates, gradients, minRTT windows), not the
controller's. Their decisions still travel through the same :class:`Decision` so the harness records them
like the controller's: ``reason`` maps each move onto the controller's vocabulary only coarsely (a
latency-driven cut says ``ttft_slo``, a drop-driven one ``upstream_errors``), and ``phase`` carries the
algorithm's own words ("gradient", "minrtt_window", "gate_closed") for whoever reads a trace.
"""

from __future__ import annotations

from typing import Any

from gateway.control.algorithm import Action, Decision, Reason
from gateway.control.observation import Observation
from gateway.control.window import Outcome, RequestSample

# A request the harness fails at submission has no duration at all (VegasLimit rejects an RTT of 0);
# over HTTP an error answered at once still takes a round trip, about a millisecond on a local network.
MIN_RTT_S = 1e-3


def rtt(sample: RequestSample) -> float:
    """The request's time at the upstream, from admission to its last byte: what a limiter in front of
    the backend times (Netflix's listener, Envoy's filter). The gateway's queue wait is not in it."""
    return max(sample.finished - sample.admitted, MIN_RTT_S)


def decision(now: float, limit: int, previous: int, phase: str, *, cut: Reason = Reason.TTFT) -> Decision:
    """A decision for a move from ``previous`` to ``limit`` (``cut`` names a decrease)."""
    if limit > previous:
        action, reason = Action.INCREASE, Reason.PROBE
    elif limit < previous:
        action, reason = Action.DECREASE, cut
    else:
        action, reason = Action.HOLD, Reason.STEADY
    return Decision(now=now, limit=limit, previous=previous, action=action, reason=reason, phase=phase)


class PerRequestLimit:
    """Netflix's ``AbstractLimit``: the limit moves on every request's sample (``onSample``), not on a tick.

    Subclasses implement ``update(rtt_s, inflight, did_drop)``, the reference's ``_update``, and return the
    new integer limit. As in Netflix's ``AbstractLimiter``, ``inflight`` is the in-flight count when the
    request was admitted (itself included); an upstream error or timeout is a drop (``onDropped``); a
    cancelled or 4xx request is ignored (``onIgnore``: no sample). ``step`` only reports where the
    limit went since the last tick, so the harness's trace and plots see it.
    """

    name = "per_request"

    def __init__(self, initial_limit: int) -> None:
        self._limit = initial_limit
        self._reported = initial_limit
        self._dropped_since_report = False
        self.samples = 0

    @property
    def limit(self) -> int:
        return self._limit

    def update(self, rtt_s: float, inflight: int, did_drop: bool) -> int:
        raise NotImplementedError

    def on_request(self, now: float, sample: RequestSample, inflight_at_start: int, inflight: int) -> int:
        if sample.outcome in (Outcome.CLIENT_CANCELLED, Outcome.CLIENT_ERROR):
            return self._limit
        did_drop = sample.outcome in (Outcome.UPSTREAM_ERROR, Outcome.TIMED_OUT)
        self._dropped_since_report |= did_drop
        self.samples += 1
        self._limit = self.update(rtt(sample), inflight_at_start, did_drop)
        return self._limit

    def step(self, observation: Observation) -> Decision:
        previous, self._reported = self._reported, self._limit
        cut = Reason.UPSTREAM_ERRORS if self._dropped_since_report else Reason.TTFT
        self._dropped_since_report = False
        return decision(observation.now, self._limit, previous, self.name, cut=cut)

    def state(self) -> dict[str, Any]:
        return {"algorithm": self.name, "limit": self._limit, "samples": self.samples}
