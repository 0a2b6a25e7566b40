"""Two questions about the backend's capacity that the knee search asks before stepping up.

How much room is left in the KV cache (so a step stops short of the cliff instead of finding it by
preempting), and whether this gateway holds more than its share of a full backend that others use
too (so two gateways do not keep whatever split the race at start-up gave them).
"""

from __future__ import annotations

import math

from gateway.control.config import AimdConfig
from gateway.control.observation import Observation

# A step up takes at most this share of the room left under kv_usage_resume: sequences admitted a
# moment ago hold only their prompt yet, and grow by a block every few tokens.
KV_ROOM_SHARE = 0.75
# Holding this much more than everyone else together on a full backend: yield a step.
FAIR_SLACK = 0.25


def kv_room(obs: Observation, config: AimdConfig) -> int | None:
    """How many more sequences fit before KV usage reaches ``kv_usage_resume``, at the KV each running
    sequence holds now (KV grows with concurrency x context); None when KV usage is unknown or stale."""
    kv, running, age = obs.kv_usage, obs.backend_running, obs.kv_usage_age_s
    if kv is None or not running or kv <= 0 or age is None or age > config.metrics_stale_s:
        return None
    per_sequence = kv / running
    return math.floor(KV_ROOM_SHARE * (config.kv_usage_resume - kv) / per_sequence)


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
