"""Whether the backend's KV-usage gauge can be believed when it says the cache is completely full.

A paged KV cache (vLLM's) gives a running sequence a new block every ``block_size`` tokens it makes. With
no free block left (usage 1.0), the next sequence that needs one can only get it by preempting another.
So a gauge that reads 1.0 on ``FULL_SCRAPES`` scrapes in a row while the request path shows tokens flowing
and the backend's preemption counter does not move contradicts itself: it is not measuring the cache (an
exporter that reports a constant, a gauge stuck at its top). Trusted, it would cut the limit by
``kv_usage_resume`` once per window down to its minimum (the ``kv_reads_one`` scenario, docs/controller.md
"Metrics that lie or go silent"). Until it reads something else it is treated as missing, as a stale
reading is. A cache that really is full loses nothing: its preemptions rise, which keeps the reading
trusted and is a signal of its own.

Only the top is judged: a reading under 1.0 that does not move is not a contradiction by itself (a
coarse gauge can repeat a value).
"""

from __future__ import annotations

from dataclasses import replace

from gateway.control.observation import Observation

FULL = 1.0
FULL_SCRAPES = 3  # readings of a full cache from this many scrapes in a row, tokens flowing throughout


class KvGauge:
    """Follows the KV readings scrape by scrape and vets each observation's."""

    def __init__(self) -> None:
        self._scraped_at: float | None = None
        self._preemptions: float | None = None
        self._full = 0  # scrapes in a row that read a full cache while tokens flowed and nothing was preempted

    @property
    def untrusted(self) -> bool:
        return self._full >= FULL_SCRAPES

    def vet(self, obs: Observation) -> Observation:
        """``obs`` as it is, or without its KV reading while the gauge contradicts itself."""
        kv, age = obs.kv_usage, obs.kv_usage_age_s
        if kv is None or age is None:
            self._full = 0
            return obs
        scraped_at = round(obs.now - age, 3)
        if scraped_at != self._scraped_at:  # a new scrape (a tick may see the same one twice)
            preempted = (
                obs.preemptions_total is not None
                and self._preemptions is not None
                and obs.preemptions_total > self._preemptions
            )
            full = kv >= FULL and obs.tokens_per_s > 0 and not preempted
            self._full = self._full + 1 if full else 0
            self._scraped_at, self._preemptions = scraped_at, obs.preemptions_total
        if not self.untrusted:
            return obs
        return replace(obs, kv_usage=None, kv_usage_age_s=None)
