"""Which count of output tokens the throughput meter reads, whatever mix of streamed and whole answers.

A streamed request shows its tokens as they are made, so the gateway's own count is exact and current.
A request that is not streamed shows its tokens only when it ends, all at once: with requests that last
longer than a reading, a reading held whichever completions happened to land in it, and requests
admitted together end together (a real vLLM read 233-360 tokens/s at limits where 520 flowed). Two
counts do not have that flaw:

* the backend's own counter, when it moves as tokens are made (vLLM's ``generation_tokens_total``
  counts per engine step; llama-server's ``tokens_predicted_total`` only when a request ends, so it is
  no better than ours). It counts every client of the backend, so this gateway takes its share: each
  increment times our requests in flight over the backend's running and waiting ones. It is a scrape
  old, so it is used only while the gateway's own count is incomplete (some traffic is not streamed);
* otherwise the gateway's own count with each non-streamed request spread evenly over its life
  (:class:`gateway.control.window.Span`); a reading over an interval is then final only once every
  request that ran in it has ended (:mod:`gateway.control.knee_search.meter`).

Pure: the clock is the caller's ``now`` and the backend's scrape time.
"""

from __future__ import annotations

from gateway.control.observation import Headroom, TokenCount
from gateway.control.window import SlidingWindow

# After the last non-streamed request, the traffic still counts as mixed for this long, so an occasional
# whole answer does not flip the meter between sources (each flip restarts the reading under way).
MIXED_HOLD_S = 60.0


class TokenAccounting:
    """One upstream's token count for the meter; call :meth:`count` once per tick."""

    def __init__(self, stale_s: float) -> None:
        self._stale_s = stale_s
        self._spans_seen = 0
        self._backend_last: tuple[float, float] | None = None  # (scrape time, the backend's counter)
        self.backend_share_total = 0.0  # this gateway's share of the backend's counter, accumulated
        # Whether the meter reads the backend's counter: the caller then reads the backend right before
        # each tick, since a reading can end only at a scrape, and a scrape a whole interval old would
        # delay every decision by that interval.
        self.counting_backend = False

    def count(self, now: float, window: SlidingWindow, headroom: Headroom, inflight: int) -> TokenCount:
        self._attribute(headroom, inflight)
        self._spans_seen, spans = window.spans_after(self._spans_seen)
        pending = window.pending_since
        last = window.unstreamed_at
        mixed = pending is not None or (last is not None and now - last <= MIXED_HOLD_S)
        self.counting_backend = mixed and self._backend_live(now, headroom)
        if self.counting_backend:
            assert headroom.backend_at is not None
            return TokenCount(self.backend_share_total, headroom.backend_at, "backend")
        return TokenCount(window.streamed_total, now, "gateway", tuple(spans), pending)

    def _backend_live(self, now: float, headroom: Headroom) -> bool:
        at = headroom.backend_at
        return (
            headroom.generation_tokens_live
            and headroom.generation_tokens_total is not None
            and self._backend_last is not None
            and at is not None
            and now - at <= self._stale_s
        )

    def _attribute(self, headroom: Headroom, inflight: int) -> None:
        """Add our share of the counter's increase since the previous scrape."""
        total, at = headroom.generation_tokens_total, headroom.backend_at
        if total is None or at is None or not headroom.generation_tokens_live:
            return
        last = self._backend_last
        if last is not None and at <= last[0]:
            return  # the same scrape as last tick
        if last is not None and total >= last[1]:
            self.backend_share_total += (total - last[1]) * share(inflight, headroom)
        self._backend_last = (at, total)  # a counter that went down was reset: start from it


def share(inflight: int, headroom: Headroom) -> float:
    """Our part of the backend's work: our requests in flight over everyone's it runs or queues.
    Unknown (a backend that does not say): all of it. Ours in transit to it can exceed what it shows."""
    running = headroom.backend_running
    if running is None:
        return 1.0
    everyone = running + (headroom.backend_waiting or 0)
    if everyone <= 0:
        return 1.0 if inflight > 0 else 0.0
    return min(1.0, inflight / everyone)
