"""Netflix concurrency-limits' ``AIMDLimit``: additive increase, multiplicative decrease on a slow request.

Reference: https://github.com/Netflix/concurrency-limits,
``concurrency-limits-core/src/main/java/com/netflix/concurrency/limits/limit/AIMDLimit.java``.
Published defaults (its ``Builder``): ``initialLimit`` 20, ``minLimit`` 20, ``maxLimit`` 200,
``backoffRatio`` 0.9, ``timeout`` 5 s.

Per sample: a drop or an RTT over ``timeout`` multiplies the limit by ``backoffRatio`` (truncated to an
integer); otherwise, when in-flight reached at least half the limit, the limit grows by one; the result is
clamped to [minLimit, maxLimit]. Its only latency signal is the end-to-end time of a request against a
fixed timeout, and an LLM request's end-to-end time is mostly its output length: with the default 5 s,
every answer longer than about 5 s of decoding reads as a drop.
"""

from __future__ import annotations

from gateway.control.baselines.common import PerRequestLimit

INITIAL_LIMIT = 20
MIN_LIMIT = 20
MAX_LIMIT = 200
BACKOFF_RATIO = 0.9
TIMEOUT_S = 5.0


class AimdLatencyLimit(PerRequestLimit):
    """``AIMDLimit._update``, one request at a time."""

    name = "aimd"

    def __init__(
        self,
        *,
        initial_limit: int = INITIAL_LIMIT,
        min_limit: int = MIN_LIMIT,
        max_limit: int = MAX_LIMIT,
        backoff_ratio: float = BACKOFF_RATIO,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        if not 0.5 <= backoff_ratio < 1.0:
            raise ValueError("Backoff ratio must be in the range [0.5, 1.0)")
        if timeout_s <= 0:
            raise ValueError("Timeout must be positive")
        super().__init__(initial_limit)
        self.min_limit, self.max_limit = min_limit, max_limit
        self.backoff_ratio, self.timeout_s = backoff_ratio, timeout_s

    def update(self, rtt_s: float, inflight: int, did_drop: bool) -> int:
        limit = self._limit
        if did_drop or rtt_s > self.timeout_s:
            limit = int(limit * self.backoff_ratio)
        elif inflight * 2 >= limit:
            limit = limit + 1
        return min(self.max_limit, max(self.min_limit, limit))
