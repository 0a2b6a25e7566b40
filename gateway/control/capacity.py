"""Two questions about the backend's capacity that the knee search asks before stepping up.

How much room is left in the KV cache (so a step stops short of the cliff instead of finding it by
preempting), and whether this gateway holds more than its share of a full backend that others use
too (so two gateways do not keep whatever split the race at start-up gave them).
"""

from __future__ import annotations

import math
from collections import deque

from gateway.control.config import AimdConfig
from gateway.control.observation import Observation

# A step up takes at most this share of the room left under kv_usage_resume: sequences admitted a
# moment ago hold only their prompt yet, and grow by a block every few tokens.
KV_ROOM_SHARE = 0.75
# Holding this much more than everyone else together on a full backend: yield a step.
FAIR_SLACK = 0.25


class KvRoom:
    """How many more sequences fit before KV usage reaches ``kv_usage_resume`` (KV grows with concurrency
    x context), counted from the running sequences and the KV each of them holds.

    A sequence's KV grows from its prompt to its whole context over its life, so one scrape's KV per
    running sequence depends on where the running requests are in their lives: a wave just admitted holds
    its prompts, one about to finish its whole contexts. Near the KV budget the room read off one scrape
    would then say "none" or "one" by the tick, and the tick a re-probe happens to fall on would decide
    the limit. The KV per sequence is therefore the mean over the last ``span_s``."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self._per_sequence: deque[tuple[float, float]] = deque()  # (when, KV usage per running sequence)

    def observe(self, obs: Observation, config: AimdConfig) -> None:
        kv, running = obs.kv_usage, obs.backend_running
        if _fresh(obs, config) and kv is not None and running:
            self._per_sequence.append((obs.now, kv / running))
        while self._per_sequence and self._per_sequence[0][0] < obs.now - self.span_s:
            self._per_sequence.popleft()

    def room(self, obs: Observation, config: AimdConfig) -> int | None:
        """Sequences that still fit; None when KV usage is unknown or stale (or nothing runs)."""
        if not _fresh(obs, config) or not obs.backend_running or not self._per_sequence:
            return None
        per_sequence = sum(per for _, per in self._per_sequence) / len(self._per_sequence)
        return math.floor(KV_ROOM_SHARE * (config.kv_usage_resume / per_sequence - obs.backend_running))


def _fresh(obs: Observation, config: AimdConfig) -> bool:
    kv, age = obs.kv_usage, obs.kv_usage_age_s
    return kv is not None and kv > 0 and age is not None and age <= config.metrics_stale_s


def over_share(obs: Observation, config: AimdConfig, *, room_to_grow: bool) -> bool:
    """Whether to yield a step to others on the same backend: it is full (no room for a step up) and
    runs clearly more of our requests than of everyone else's.

    Each gateway judges slots by its own throughput, and its own throughput rises with its share of
    the backend, so two gateways at their knees would hold any split. Yielding by additive steps from
    the larger side, and taking freed room from the smaller, is what lets them even out (AIMD's
    fairness), without any coordination between them."""
    running, age = obs.backend_running, obs.backend_running_age_s
    if running is None or age is None or age > config.metrics_stale_s or room_to_grow:
        return False
    others = running - obs.inflight
    return others > 0 and obs.inflight > (1 + FAIR_SLACK) * others
