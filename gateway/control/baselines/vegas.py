"""Netflix concurrency-limits' ``VegasLimit``: TCP Vegas's queue estimate from the minimum RTT.

Reference: https://github.com/Netflix/concurrency-limits,
``concurrency-limits-core/src/main/java/com/netflix/concurrency/limits/limit/VegasLimit.java`` (and
``limit/functions/Log10RootIntFunction.java``). Published defaults (its ``Builder``): ``initialLimit`` 20,
``maxConcurrency`` 1000, ``smoothing`` 1.0, ``alpha`` = 3 x log10(limit), ``beta`` = 6 x log10(limit),
``threshold`` = log10(limit), increase = limit + log10(limit), decrease = limit - log10(limit),
``probeMultiplier`` 30, where log10(n) is ``max(1, int(log10(n)))`` (1 for any limit under 100).

Per sample: every ``probeJitter x probeMultiplier x limit`` samples (jitter uniform in [0.5, 1)) the
sample becomes the new no-load RTT; a sample under the no-load RTT replaces it. Otherwise the queue
estimate is ``ceil(limit x (1 - rtt_noload / rtt))``: a drop decreases; in-flight under half the limit
holds (no upward drift when app-limited); a queue <= threshold adds beta, < alpha adds log10, > beta
subtracts log10, in between holds. An LLM request's RTT is mostly its output length, so the queue
estimate is mostly the spread of answer lengths.
"""

from __future__ import annotations

import math
import random

from gateway.control.baselines.common import PerRequestLimit

INITIAL_LIMIT = 20
MAX_CONCURRENCY = 1000
SMOOTHING = 1.0
PROBE_MULTIPLIER = 30


def log10_root(n: int) -> int:
    """``Log10RootIntFunction`` with baseline 0: ``max(1, (int) log10(n))`` below 1000, ``(int) log10(n)`` above."""
    if n < 1000:
        return 1 if n < 10 else max(1, int(math.log10(n)))
    return int(math.log10(n))


class VegasLimit(PerRequestLimit):
    """``VegasLimit._update``, one request at a time. ``seed`` drives the probe jitter
    (``ThreadLocalRandom`` in the reference), so runs repeat."""

    name = "vegas"

    def __init__(
        self,
        *,
        initial_limit: int = INITIAL_LIMIT,
        max_concurrency: int = MAX_CONCURRENCY,
        smoothing: float = SMOOTHING,
        probe_multiplier: int = PROBE_MULTIPLIER,
        seed: int = 0,
    ) -> None:
        super().__init__(initial_limit)
        self.estimated_limit = float(initial_limit)
        self.max_limit = max_concurrency
        self.smoothing = smoothing
        self.probe_multiplier = probe_multiplier
        self.rtt_noload = 0.0
        self.probe_count = 0
        self._rng = random.Random(seed)
        self.probe_jitter = self._rng.uniform(0.5, 1.0)

    def _should_probe(self) -> bool:
        return self.probe_jitter * self.probe_multiplier * self.estimated_limit <= self.probe_count

    def update(self, rtt_s: float, inflight: int, did_drop: bool) -> int:
        if rtt_s <= 0:
            raise ValueError(f"rtt must be >0 but got {rtt_s}")
        self.probe_count += 1
        if self._should_probe():
            self.probe_jitter = self._rng.uniform(0.5, 1.0)
            self.probe_count = 0
            self.rtt_noload = rtt_s
            return int(self.estimated_limit)
        if self.rtt_noload == 0 or rtt_s < self.rtt_noload:
            self.rtt_noload = rtt_s
            return int(self.estimated_limit)
        return self._update_estimated_limit(rtt_s, inflight, did_drop)

    def queue_estimate(self, rtt_s: float) -> int:
        return math.ceil(self.estimated_limit * (1 - self.rtt_noload / rtt_s))

    def _update_estimated_limit(self, rtt_s: float, inflight: int, did_drop: bool) -> int:
        estimated = self.estimated_limit
        queue_size = self.queue_estimate(rtt_s)
        if did_drop:
            new_limit = estimated - log10_root(int(estimated))
        elif inflight * 2 < estimated:
            return int(estimated)
        else:
            alpha = 3 * log10_root(int(estimated))
            beta = 6 * log10_root(int(estimated))
            threshold = log10_root(int(estimated))
            if queue_size <= threshold:
                new_limit = estimated + beta
            elif queue_size < alpha:
                new_limit = estimated + log10_root(int(estimated))
            elif queue_size > beta:
                new_limit = estimated - log10_root(int(estimated))
            else:
                return int(estimated)
        new_limit = max(1.0, min(float(self.max_limit), new_limit))
        new_limit = (1 - self.smoothing) * estimated + self.smoothing * new_limit
        self.estimated_limit = new_limit
        return int(new_limit)
