"""One upstream's in-flight slots (:class:`Limiter`): the limit the controller moves, and the count it holds."""

from __future__ import annotations

from collections.abc import Callable

from gateway.control.window import RequestSample

# Told of each request that ended on a limiter, after its permit was returned and before anyone queued takes
# it: (its sample, the in-flight count just after it was admitted, the in-flight count now).
EndListener = Callable[[RequestSample, int, int], None]


class Limiter:
    """In-flight slots for one upstream, one per sequence the backend runs: a request asking for ``n``
    answers to ``k`` prompts holds ``n x k`` of them, as it holds that many of the backend's batch slots and
    KV cache. The limit may change at any time; lowering it below the current in-flight count never cancels
    running requests, it only stops new admissions.

    ``on_end``, when set, hears of every request that ends, in time to change the limit before the freed
    permit is handed on (an algorithm that learns per request, ``gateway.server.feedback.control_loop``)."""

    def __init__(self, name: str, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.name = name
        self.limit = limit
        self.inflight = 0
        self._peak = 0
        self.on_end: EndListener | None = None

    @property
    def free(self) -> int:
        return max(self.limit - self.inflight, 0)

    @property
    def has_room(self) -> bool:
        return self.inflight < self.limit

    def set_limit(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit

    def fits(self, slots: int) -> bool:
        return self.inflight + slots <= self.limit

    def acquire(self, slots: int = 1) -> None:
        self.inflight += slots
        if self.inflight > self._peak:
            self._peak = self.inflight

    def release(self, slots: int = 1) -> None:
        if self.inflight < slots:
            raise RuntimeError(f"release without acquire on {self.name}")
        self.inflight -= slots

    def take_peak(self) -> int:
        """Highest in-flight count since the last call (at least the current one); resets the mark."""
        peak = max(self._peak, self.inflight)
        self._peak = self.inflight
        return peak
