"""The backend's capacity, as the controller's bounds and the knee search's steps need it.

How many requests its KV cache holds (the hard cap's KV term, from the recent requests' footprint), how
much room is left in it now (so a step stops short of the cliff instead of finding it by preempting), and
whether this gateway holds more than its share of a full backend that others use too (so two gateways do
not keep whatever split the race at start-up gave them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.control.config import AimdConfig
from gateway.control.knee_search.timed_mean import TimedMean
from gateway.control.observation import Observation
from gateway.control.window import Outcome, RequestSample

# A step up takes at most this share of the room left under kv_usage_resume: sequences admitted a
# moment ago hold only their prompt yet, and grow by a block every few tokens.
KV_ROOM_SHARE = 0.75
# Holding this much more than everyone else together on a full backend: yield a step.
FAIR_SLACK = 0.25


# The hard cap keeps the requests' KV this many standard deviations under the cache's size (see kv_cap).
SPREAD_K = 3.0
# Answers whose lengths all lie within this share of their mean are of one length (see Footprint).
ALIKE = 0.1
# A footprint from fewer requests replaces a known one only if none is known (see Footprint.update).
FOOTPRINT_SAMPLES = 8


@dataclass(frozen=True, slots=True)
class Footprint:
    """The KV one running request holds at a random moment, in tokens: its mean and standard deviation.

    A paged KV cache (vLLM's) gives a request its blocks as it computes tokens: it holds its prompt, then
    one more token per token made, and frees everything when it ends. A request making ``o`` tokens runs
    for a time in proportion to ``o``, so at a random moment a running request is one of the recent
    requests weighted by its output, a uniform share ``u`` of the way through it, holding ``p + u * o``.

    That holds for requests out of step with each other. Answers of one length (a benchmark's fixed
    ``max_tokens`` with ``ignore_eos``) admitted in the same engine step end in the same step, and a closed
    loop admits their successors together again: their KV peaks together, at their end. Such a footprint is
    ``in_step``: ``mean`` is then the mean prompt + answer, and ``sd`` 0."""

    mean: float
    sd: float
    in_step: bool = False
    requests: int = 1  # how many it was worked out from

    @classmethod
    def of(cls, samples: Iterable[RequestSample]) -> Footprint | None:
        """From the successful requests among ``samples``; None when none made a token."""
        done = [(s.prompt_tokens, s.output_tokens) for s in samples if s.outcome is Outcome.OK and s.output_tokens > 0]
        weight = sum(o for _, o in done)
        if not weight:
            return None
        outputs = [o for _, o in done]
        if max(outputs) - min(outputs) <= ALIKE * weight / len(done):
            return cls(mean=sum(p + o for p, o in done) / len(done), sd=0.0, in_step=True, requests=len(done))
        mean = sum(o * (p + o / 2) for p, o in done) / weight
        square = sum(o * (p * p + p * o + o * o / 3) for p, o in done) / weight
        return cls(mean=max(mean, 1.0), sd=math.sqrt(max(square - mean * mean, 0.0)), requests=len(done))

    @staticmethod
    def update(known: Footprint | None, samples: Iterable[RequestSample]) -> Footprint | None:
        """The footprint to hold after a window of ``samples``: theirs when they are ``FOOTPRINT_SAMPLES``
        requests or more, or nothing is known yet; else the known one. A few requests of a spread of lengths
        can look alike (three answers of 140-152 tokens), and the cap would move with whichever happened to
        end; after an idle spell the first requests still meet the KV room their kind needs."""
        found = Footprint.of(samples)
        if found is not None and (known is None or found.requests >= FOOTPRINT_SAMPLES):
            return found
        return known


def kv_cap(capacity_tokens: int, block_size: int | None, footprint: Footprint) -> int:
    """How many such requests the KV cache holds: the hard cap's KV term.

    ``n`` requests out of step hold ``n`` times the mean, give or take ``sqrt(n)`` standard deviations; the
    cap is the largest ``n`` whose KV stays ``SPREAD_K`` of those under the cache's size, so that a
    preemption is rare even at the cap. Counting each request at its end instead (prompt + output: every
    request's longest at once) would leave a fifth of the cache unused with chat-like lengths: 38 requests
    on the simulator's Llama-3.1-8B-on-24-GB profile, whose first preemption comes at 45
    (docs/controller.md). Requests in step are counted at their end. Where the block size is known the KV
    counts whole blocks: vLLM gives a request whole blocks (half of its last one empty on average, a whole
    number of them at its end), from all but one of its blocks (its null block)."""
    if block_size:
        room = float(capacity_tokens // block_size - 1)
        if footprint.in_step:
            return max(int(room // math.ceil(footprint.mean / block_size)), 1)
        mean = footprint.mean / block_size + 0.5
        sd = math.sqrt((footprint.sd / block_size) ** 2 + 1 / 12)
    else:
        room, mean, sd = float(capacity_tokens), footprint.mean, footprint.sd
    n = int(room // mean)
    while n > 1 and n * mean + SPREAD_K * math.sqrt(n) * sd > room:
        n -= 1
    return max(n, 1)


class KvRoom:
    """How many more sequences fit before KV usage reaches ``kv_usage_resume`` (KV grows with concurrency
    x context), counted from the running sequences and the KV each of them holds.

    A sequence's KV grows from its prompt to its whole context over its life, so one scrape's KV per
    running sequence depends on where the running requests are in their lives: a wave just admitted holds
    its prompts, one about to finish its whole contexts. Near the KV budget the room read off one scrape
    would then say "none" or "one" by the tick, and the tick a re-probe happens to fall on would decide
    the limit. The KV per sequence is therefore the mean over the last ``span_s``."""

    def __init__(self, span_s: float) -> None:
        self._per_sequence = TimedMean(span_s)  # KV usage per running sequence

    def observe(self, obs: Observation, config: AimdConfig) -> None:
        kv, running = obs.kv_usage, obs.backend_running
        if _fresh(obs, config) and kv is not None and running:
            self._per_sequence.add(obs.now, kv / running)
        else:
            self._per_sequence.forget(obs.now)

    def room(self, obs: Observation, config: AimdConfig) -> int | None:
        """How many sequences a step up may add: ``KV_ROOM_SHARE`` of the room under ``kv_usage_resume``,
        but the one sequence that fits whole where the room holds one: in a cache of a dozen requests
        three quarters of one would forbid the last step under the line for ever. None when KV usage is
        unknown or stale (or nothing runs)."""
        room = self._sequences(obs, config)
        if room is None:
            return None
        return max(math.floor(KV_ROOM_SHARE * room), 1 if room >= 1 else 0)

    def full(self, obs: Observation, config: AimdConfig) -> bool:
        """Whether the cache is full for sharing's sake (``over_share``): less than a sequence and a third
        of room (three quarters of it under one), so that a step beside another gateway's takes room the
        other could use, and the larger one yields."""
        room = self._sequences(obs, config)
        return room is not None and math.floor(KV_ROOM_SHARE * room) <= 0

    def _sequences(self, obs: Observation, config: AimdConfig) -> float | None:
        if not _fresh(obs, config) or not obs.backend_running:
            return None
        per_sequence = self._per_sequence.mean()
        if per_sequence is None:
            return None
        return config.kv_usage_resume / per_sequence - obs.backend_running


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
