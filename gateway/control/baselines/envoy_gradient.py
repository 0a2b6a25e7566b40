"""Envoy's adaptive concurrency filter, gradient controller.

Reference: https://github.com/envoyproxy/envoy,
``source/extensions/filters/http/adaptive_concurrency/controller/gradient_controller.cc``, its proto
``api/envoy/extensions/filters/http/adaptive_concurrency/v3/adaptive_concurrency.proto`` and
https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_filters/adaptive_concurrency_filter.
Published defaults (the proto): ``max_concurrency_limit`` 1000, ``min_rtt_calc_params.request_count`` 50,
``jitter`` 15%, ``min_concurrency`` 3, ``buffer`` 25%, ``sample_aggregate_percentile`` p50,
``min_concurrency_limit`` unset (so ``min_concurrency`` is both the floor and the limit pinned while minRTT
is measured). Two fields are required and have no default; this uses the documentation's example
values: ``concurrency_update_interval`` 100 ms and ``min_rtt_calc_params.interval`` 60 s.

How it moves (as the source does):

- minRTT window: on start, every ``interval`` (+ jitter) after the last one ends, and after the limit sat
  at ``min_concurrency`` for 5 consecutive sample windows: the limit is pinned to ``min_concurrency`` and
  the window lasts until ``request_count`` requests *started inside it* have finished; their p50 is the
  new minRTT, and the limit from before the window comes back.
- Otherwise every ``concurrency_update_interval`` with samples: sampleRTT = their p50;
  gradient = clamp(minRTT x (1 + buffer) / sampleRTT, 0.5, 2); limit = trunc(limit x gradient +
  sqrt(limit x gradient)), clamped to [min_concurrency, max].

Latency is the whole request, from the filter seeing its headers to the end of its response: on an LLM
stream that is mostly the answer's length. The harness must tick it every ``concurrency_update_interval``.
"""

from __future__ import annotations

import math
import random
from typing import Any

from gateway.control.algorithm import Decision
from gateway.control.baselines.common import decision, rtt
from gateway.control.observation import Observation
from gateway.control.window import Outcome, RequestSample, percentile

CONCURRENCY_UPDATE_INTERVAL_S = 0.1
MIN_RTT_CALC_INTERVAL_S = 60.0
MIN_RTT_REQUEST_COUNT = 50
JITTER = 0.15
MIN_CONCURRENCY = 3
MIN_RTT_BUFFER = 0.25
SAMPLE_AGGREGATE_PERCENTILE = 50.0
MAX_CONCURRENCY_LIMIT = 1000
CONSECUTIVE_MIN_WINDOWS = 5


class EnvoyGradient:
    """``GradientController`` on virtual time: its timers fire at the tick that reaches them. ``seed`` drives the
    minRTT interval's jitter (Envoy's own random generator in the reference), so runs repeat."""

    def __init__(
        self,
        *,
        update_interval_s: float = CONCURRENCY_UPDATE_INTERVAL_S,
        min_rtt_interval_s: float = MIN_RTT_CALC_INTERVAL_S,
        request_count: int = MIN_RTT_REQUEST_COUNT,
        jitter: float = JITTER,
        min_concurrency: int = MIN_CONCURRENCY,
        buffer: float = MIN_RTT_BUFFER,
        percentile: float = SAMPLE_AGGREGATE_PERCENTILE,
        max_limit: int = MAX_CONCURRENCY_LIMIT,
        seed: int = 0,
        now: float = 0.0,
    ) -> None:
        self.update_interval_s = update_interval_s
        self.min_rtt_interval_s = min_rtt_interval_s
        self.request_count = request_count
        self.jitter = jitter
        self.min_concurrency = min_concurrency
        self.buffer = buffer
        self.percentile = percentile
        self.max_limit = max_limit
        self._rng = random.Random(seed)
        self._limit = min_concurrency
        self._reported = min_concurrency
        self.min_rtt: float | None = None
        self.sample_rtt: float | None = None
        self.gradient: float | None = None
        self._samples: list[float] = []
        self._deferred_limit = 0
        self._in_min_rtt_window = False
        self._min_rtt_epoch = float("-inf")
        self._next_min_rtt: float | None = None
        self._next_reset: float | None = None
        self._consecutive_min = 0
        self._enter_min_rtt_window(now)
        self._next_reset = now + update_interval_s

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_min_rtt_window(self) -> bool:
        return self._in_min_rtt_window

    # --- the controller's own events ---------------------------------------------------------------
    def _enter_min_rtt_window(self, now: float) -> None:
        if self._in_min_rtt_window:
            return
        self._in_min_rtt_window = True
        self._next_min_rtt = None
        self._deferred_limit = self._limit
        self._set_limit(self.min_concurrency)
        self._samples.clear()
        self._min_rtt_epoch = now

    def _update_min_rtt(self, now: float) -> None:
        if self._samples:
            self.min_rtt = self._aggregate()
        self._set_limit(self._deferred_limit)
        self._deferred_limit = 0
        self._in_min_rtt_window = False
        self._next_min_rtt = now + self._with_jitter(self.min_rtt_interval_s)
        self._next_reset = now + self.update_interval_s

    def _with_jitter(self, interval_s: float) -> float:
        if self.jitter == 0:
            return interval_s
        range_ms = math.ceil(interval_s * 1000 * self.jitter)
        return interval_s + self._rng.randrange(range_ms) / 1000.0

    def _reset_sample_window(self) -> None:
        if not self._samples or self.min_rtt is None:
            self._samples.clear()
            return
        self.sample_rtt = self._aggregate()
        self._set_limit(self._calculate_new_limit())

    def _aggregate(self) -> float:
        value = percentile(self._samples, self.percentile)
        self._samples.clear()
        assert value is not None
        return value

    def _calculate_new_limit(self) -> int:
        assert self.min_rtt is not None and self.sample_rtt is not None
        buffered = self.min_rtt + self.min_rtt * self.buffer
        self.gradient = max(0.5, min(2.0, buffered / self.sample_rtt))
        limit = self._limit * self.gradient
        new_limit = int(limit + math.sqrt(limit))
        return max(self.min_concurrency, min(self.max_limit, new_limit))

    def _set_limit(self, new_limit: int) -> None:
        old = self._limit
        self._limit = new_limit
        if not self._in_min_rtt_window and old == self.min_concurrency and new_limit == self.min_concurrency:
            self._consecutive_min += 1
        else:
            self._consecutive_min = 0
        if self._consecutive_min >= CONSECUTIVE_MIN_WINDOWS:
            self._next_min_rtt = -math.inf  # the timer is re-armed to fire at once

    def _fire_timers(self, now: float) -> None:
        """Run every timer due by ``now`` in time order. The sample timer re-arms itself one interval
        after it fired; firings between two events of the harness would find no samples, so they are
        skipped to the first one after ``now``."""
        eps = 1e-9
        while True:
            due = [
                (t, kind)
                for t, kind in ((self._next_min_rtt, "min_rtt"), (self._next_reset, "reset"))
                if t is not None and t <= now + eps
            ]
            if not due:
                return
            at, kind = min(due)
            if kind == "min_rtt":
                self._enter_min_rtt_window(now)
            elif self._in_min_rtt_window:
                self._next_reset = None  # re-armed when the minRTT window ends
            else:
                self._reset_sample_window()
                missed = math.floor((now + eps - at) / self.update_interval_s)
                self._next_reset = at + (missed + 1) * self.update_interval_s

    # --- the LimitAlgorithm / RequestObserver interface -----------------------------------------
    def on_request(self, now: float, sample: RequestSample, inflight_at_start: int, inflight: int) -> int:
        """``recordLatencySample``: every response that completes counts, whatever its status; a request
        started before the current minRTT window began does not."""
        self._fire_timers(now)
        if sample.outcome in (Outcome.CLIENT_CANCELLED,):
            return self._limit  # cancelLatencySample
        if sample.admitted < self._min_rtt_epoch:
            return self._limit
        self._samples.append(rtt(sample))
        if self._in_min_rtt_window and len(self._samples) >= self.request_count:
            self._update_min_rtt(now)
        return self._limit

    def step(self, observation: Observation) -> Decision:
        self._fire_timers(observation.now)
        previous, self._reported = self._reported, self._limit
        phase = "minrtt_window" if self._in_min_rtt_window else "gradient"
        return decision(observation.now, self._limit, previous, phase)

    def state(self) -> dict[str, Any]:
        return {
            "algorithm": "envoy_gradient",
            "limit": self._limit,
            "min_rtt": self.min_rtt,
            "sample_rtt": self.sample_rtt,
            "gradient": self.gradient,
            "in_min_rtt_window": self._in_min_rtt_window,
        }
