"""One upstream's controller as the gateway and the scenario harness run it: inputs in, decision out.

Each control tick the caller hands over what it measured (its sliding window, the limiter's numbers,
headroom readings, the hard cap, the cumulative token count) and gets a :class:`Decision` back; it
applies ``decision.limit`` to its limiter, counts the decision in Prometheus, and logs it when
``decision.changed``. This object keeps a short decision log for the JSON state view, with repeated
holds folded into one entry, so the log shows the last *moves* and the reasons in between instead of
a page of identical "hold: steady". Pure: no clock, no I/O, no HTTP library.

Latency evidence restarts at every decrease: a request admitted before it ran at a limit that no
longer exists, and counting its slow finish again would cut the limit twice for one overload (the
cascade that otherwise takes a limit from the cliff to a fraction of the knee).

Nor do the first tokens of a burst count. A step up admits its new slots' requests at once, and so does
demand that arrives to find slots free (the first clients, the end of an idle spell): their prefills queue
behind each other, and with long prompts the last of them waits seconds for its first token. That is the
burst's doing, not the limit's; in steady state admissions are spread out. So requests admitted within
``settle_s`` after an increase, or between a tick that had slots to spare and the next one that had
none (and ``settle_s`` after it), are left out of the TTFT evidence. Their decoding still counts towards
TPOT: it ran at the limit being judged, and a limit over a TPOT cliff shows first in the requests it
admitted at once.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from gateway.control.accounting import TokenAccounting
from gateway.control.algorithm import Action, Decision, LimitAlgorithm
from gateway.control.config import AimdConfig, StartPoint
from gateway.control.knee_search.aimd import Aimd
from gateway.control.observation import (
    NO_HEADROOM,
    Headroom,
    Latency,
    LimiterState,
    Observation,
    TokenCount,
    observe,
)
from gateway.control.share import Peers
from gateway.control.window import SlidingWindow, WindowStats

# Requests admitted before a decrease ran at the higher limit, so they stop counting as evidence for the
# latency objectives, except after a small one (the hard cap or the knee moving a slot or two): with answers
# that take longer than the limit holds still, no request would ever count and the objectives would go unjudged.
EVIDENCE_KEPT_DECREASE = 0.1
# How long a burst is remembered. The window holds requests by when they *finished*, and a burst's requests
# reach it an answer's length after they were admitted (minutes, for reasoning answers on a slowed backend):
# a burst forgotten when it left the window's horizon let its late first tokens cut the limit.
BURST_MEMORY_S = 600.0


class UpstreamControl:
    """The controller of one upstream: builds the observation, steps the algorithm, keeps the log."""

    def __init__(
        self,
        name: str,
        config: AimdConfig,
        *,
        initial_limit: int,
        start: StartPoint | None = None,
        algorithm: LimitAlgorithm | None = None,
        log_size: int = 50,
    ) -> None:
        self.name = name
        self.config = config
        self.start = start
        self.algorithm: LimitAlgorithm = algorithm or Aimd(config, initial_limit=initial_limit, start=start)
        self._log: deque[dict[str, Any]] = deque(maxlen=log_size)
        self.last: Decision | None = None
        self.last_observation: Observation | None = None
        self.last_stats: WindowStats | None = None
        self.ticks = 0
        self._evidence_since = float("-inf")
        self._bursts: deque[tuple[float, float]] = deque()  # (from, until): admissions of a burst
        self._spare_at: float | None = float("-inf")  # the last tick, if it had slots to spare
        self.accounting = TokenAccounting(config.metrics_stale_s)

    @property
    def limit(self) -> int:
        return self.algorithm.limit

    def tick(
        self,
        now: float,
        window: SlidingWindow,
        limiter: LimiterState,
        headroom: Headroom = NO_HEADROOM,
        *,
        hard_cap: int | None = None,
        tokens_total: float | None = None,
        peers: Peers | None = None,
    ) -> Decision:
        """One control step. A cumulative count of this upstream's output tokens lets throughput be read
        over exactly the interval at one limit: the gateway's own, or its share of the backend's
        (``gateway.control.accounting`` chooses, from the window and ``headroom``), or ``tokens_total``
        when given. The window's statistics are kept in ``last_stats`` for the caller's gauges. ``peers``:
        the other replicas of this upstream, when they share their numbers (``gateway.control.share``)."""
        if tokens_total is None:
            count = self.accounting.count(now, window, headroom, limiter.inflight)
        else:
            count = TokenCount(tokens_total, now)
        stats = window.stats(now)
        full = limiter.full
        if full and self._spare_at is not None:
            self._burst(self._spare_at, now + self.config.settle_s)
        self._spare_at = None if full else now
        while self._bursts and self._bursts[0][1] < now - BURST_MEMORY_S:
            self._bursts.popleft()
        fresh = [s for s in window.samples(now) if s.admitted >= self._evidence_since]
        first_tokens = [s for s in fresh if not self._in_burst(s.admitted)]
        observation = observe(
            now,
            stats,
            limiter,
            headroom,
            hard_cap=hard_cap,
            latency=Latency.of(fresh, first_tokens),
            count=count,
            peers=peers,
        )
        decision = self.algorithm.step(observation)
        if decision.action is Action.DECREASE and decision.limit < (1 - EVIDENCE_KEPT_DECREASE) * decision.previous:
            self._evidence_since = now
        elif decision.limit > decision.previous:
            self._burst(now, now + self.config.settle_s)
        self.last_stats = stats
        self.ticks += 1
        self.last = decision
        self.last_observation = observation
        self._remember(decision)
        return decision

    def _burst(self, start: float, until: float) -> None:
        """Admissions in ``[start, until)`` were a burst; one overlapping the last is merged into it."""
        if self._bursts and self._bursts[-1][0] <= start <= self._bursts[-1][1]:
            first, last = self._bursts[-1]
            self._bursts[-1] = (first, max(last, until))
        else:
            self._bursts.append((start, until))

    def _in_burst(self, admitted: float) -> bool:
        return any(start <= admitted < until for start, until in self._bursts)

    def _remember(self, decision: Decision) -> None:
        previous = self._log[-1] if self._log else None
        if (
            previous is not None
            and decision.action is Action.HOLD
            and previous["action"] == Action.HOLD.value
            and previous["reason"] == decision.reason.value
            and previous["limit"] == decision.limit
        ):
            previous["count"] += 1
            previous["until"] = round(decision.now, 3)
            previous["inputs"] = decision.inputs  # the latest inputs behind the same verdict
            return
        entry = decision.as_dict()
        entry["count"] = 1
        entry["until"] = entry["now"]
        self._log.append(entry)

    def decisions(self) -> list[dict[str, Any]]:
        """The decision log, oldest first (JSON-able)."""
        return list(self._log)

    def state(self) -> dict[str, Any]:
        """Everything the JSON state view shows for this upstream."""
        return {
            "upstream": self.name,
            "limit": self.limit,
            "ticks": self.ticks,
            "start": None
            if self.start is None
            else {
                "limit": self.start.limit,
                "peak_tokens_per_s": self.start.peak_tokens_per_s,
            },
            "config": self.config.model_dump(),
            "algorithm": self.algorithm.state(),
            "last_decision": None if self.last is None else self.last.as_dict(),
            "decisions": self.decisions(),
        }

    def log_fields(self, decision: Decision) -> dict[str, Any]:
        """Fields for the structured log line the gateway writes when ``decision.changed``."""
        inputs = decision.inputs
        return {
            "event": "limit_change",
            "upstream": self.name,
            "limit": decision.limit,
            "previous": decision.previous,
            "action": decision.action.value,
            "reason": decision.reason.value,
            "phase": decision.phase,
            **{
                key: inputs.get(key)
                for key in (
                    "tokens_per_s",
                    "measured_tokens_per_s",
                    "ttft_p99",
                    "tpot_p99",
                    "queue_depth",
                    "peak_inflight",
                    "kv_usage",
                    "backend_waiting",
                    "upstream_errors",
                    "timeouts",
                )
                if inputs.get(key) is not None
            },
        }
