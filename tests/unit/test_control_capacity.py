"""The KV cache as the controller reads it: how many requests it holds (the hard cap), and the room for
more sequences the knee search reads before stepping up."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from gateway.control.config import AimdConfig
from gateway.control.knee_search.capacity import Footprint, KvRoom, kv_cap
from gateway.control.observation import LimiterState, Observation, observe
from gateway.control.window import Outcome, RequestSample, SlidingWindow

CONFIG = AimdConfig()  # kv_usage_resume 0.9


def scrape(now: float, kv: float | None, running: int, age_s: float = 1.0) -> Observation:
    obs = observe(now, SlidingWindow(10.0).stats(now), LimiterState(running, running, running, 0))
    return replace(obs, kv_usage=kv, kv_usage_age_s=age_s, backend_running=running)


def test_the_room_counts_sequences_at_the_kv_each_holds_on_average_over_the_span() -> None:
    """Ten sequences whose KV swings with their lives (a wave of prompts, then whole contexts): 0.072 to
    0.084 of the cache each. The last scrape alone (0.84) leaves no room; the mean (0.078) leaves one."""
    room = KvRoom(span_s=10.0)
    for tick in range(10):
        room.observe(scrape(float(tick), 0.72 if tick % 2 == 0 else 0.84, 10), CONFIG)
    assert room.room(scrape(9.0, 0.84, 10), CONFIG) == 1
    single = KvRoom(span_s=10.0)
    single.observe(scrape(9.0, 0.84, 10), CONFIG)
    assert single.room(scrape(9.0, 0.84, 10), CONFIG) == 0


def test_old_scrapes_leave_the_span_and_the_room_follows_longer_contexts() -> None:
    room = KvRoom(span_s=10.0)
    for tick in range(10):
        room.observe(scrape(float(tick), 0.5, 10), CONFIG)  # 0.05 each: room for 0.75 x 8 = 6 more
    assert room.room(scrape(9.0, 0.5, 10), CONFIG) == 6
    for tick in range(20, 30):
        room.observe(scrape(float(tick), 0.8, 10), CONFIG)  # longer prompts now: 0.08 each
    assert room.room(scrape(29.0, 0.8, 10), CONFIG) == 1  # 1.25 more fit: the one that fits whole
    for tick in range(40, 50):
        room.observe(scrape(float(tick), 0.85, 10), CONFIG)  # 0.085 each: 0.59 more, none whole
    assert room.room(scrape(49.0, 0.85, 10), CONFIG) == 0


def test_a_cache_with_room_for_less_than_a_sequence_and_a_third_is_full_for_sharing() -> None:
    """A step of one where 1.25 fit is the knee search's to take; for two gateways evening out their shares
    the cache is full, and the larger one yields (``over_share``)."""
    room = KvRoom(span_s=10.0)
    room.observe(scrape(0.0, 0.8, 10), CONFIG)
    assert room.room(scrape(0.0, 0.8, 10), CONFIG) == 1 and room.full(scrape(0.0, 0.8, 10), CONFIG)
    room = KvRoom(span_s=10.0)
    room.observe(scrape(0.0, 0.5, 10), CONFIG)
    assert not room.full(scrape(0.0, 0.5, 10), CONFIG)
    assert not KvRoom(span_s=10.0).full(scrape(0.0, 0.5, 10), CONFIG)  # unknown is not full


def test_unknown_or_stale_kv_usage_gives_no_room_figure() -> None:
    room = KvRoom(span_s=10.0)
    room.observe(scrape(0.0, 0.5, 10), CONFIG)
    assert room.room(scrape(1.0, None, 10), CONFIG) is None
    assert room.room(scrape(1.0, 0.5, 10, age_s=CONFIG.metrics_stale_s + 1), CONFIG) is None
    assert room.room(scrape(1.0, 0.5, 0), CONFIG) is None
    assert KvRoom(span_s=10.0).room(scrape(1.0, 0.5, 10), CONFIG) is None  # nothing observed yet


def ended(prompt: int, output: int, outcome: Outcome = Outcome.OK) -> RequestSample:
    return RequestSample(0.0, 0.0, 1.0, 0.1, prompt_tokens=prompt, output_tokens=output, outcome=outcome)


def test_a_running_request_holds_its_prompt_and_half_its_answer_on_average_weighted_by_its_length() -> None:
    # A request making twice the tokens runs twice as long, so it is the one running twice as often.
    two = Footprint.of([ended(500, 100), ended(500, 200), ended(9000, 50, Outcome.UPSTREAM_ERROR)])
    assert two is not None and not two.in_step
    assert two.mean == pytest.approx((100 * 550 + 200 * 600) / 300)
    # held: 500 plus uniformly 0-100 (a third of the time) or 0-200 (two thirds): E[x^2] - E[x]^2
    second_moment = (100 * 100**2 / 3 + 200 * 200**2 / 3) / 300
    assert two.sd == pytest.approx(math.sqrt(second_moment - (two.mean - 500) ** 2))
    assert Footprint.of([ended(500, 0)]) is None and Footprint.of([]) is None


def test_answers_of_one_length_are_counted_at_their_end_since_they_may_run_in_step() -> None:
    alike = Footprint.of([ended(32, 200), ended(32, 195), ended(40, 205)])
    assert alike == Footprint(mean=(232 + 227 + 245) / 3, sd=0.0, in_step=True, requests=3)
    # 128 blocks of 32: 127 usable over 8 blocks each at their end, where out of step 21 would fit.
    assert kv_cap(128 * 32, 32, alike) == 15
    spread = Footprint.of([ended(32, 150), ended(32, 250)])
    assert spread is not None and not spread.in_step
    assert kv_cap(128 * 32, 32, spread) > 15


def test_the_footprint_matches_requests_sampled_while_they_run() -> None:
    """Sample running requests at random moments of a closed loop with random lengths: the held tokens'
    mean and spread are what ``Footprint.of`` says from the lengths alone."""
    rng = random.Random(3)
    requests = [ended(rng.randint(256, 768), rng.randint(256, 768)) for _ in range(400)]
    footprint = Footprint.of(requests)
    assert footprint is not None
    weights = [r.output_tokens for r in requests]
    held = []
    for request in rng.choices(requests, weights=weights, k=50_000):
        held.append(request.prompt_tokens + rng.random() * request.output_tokens)
    mean = sum(held) / len(held)
    sd = math.sqrt(sum((h - mean) ** 2 for h in held) / len(held))
    assert footprint.mean == pytest.approx(mean, rel=0.01)
    assert footprint.sd == pytest.approx(sd, rel=0.03)


def test_the_kv_cap_keeps_three_spreads_of_the_requests_kv_under_the_cache() -> None:
    """The tests' vLLM budget: 545-token prompts, 96-160-token answers, 263 usable blocks of 32. At their
    longest 11 fit; at their life's mean (610 tokens, 19.6 blocks) 13 fill the cache on average, and 12 leave
    three spreads (3 x sqrt(12) x 1.3 blocks) to spare."""
    footprint = Footprint.of([ended(545, output) for output in range(96, 161, 8)])
    assert footprint is not None
    assert footprint.mean == pytest.approx(610.7, abs=0.1)
    assert kv_cap(264 * 32, 32, footprint) == 12
    # The simulator's Llama-3.1-8B on 24 GB with chat lengths (prompts and answers of 256-768): 43 requests,
    # where counting each at its end would say 38 and static limits first preempt at 45.
    rng = random.Random(1)
    chat = Footprint.of([ended(rng.randint(256, 768), rng.randint(256, 768)) for _ in range(2000)])
    assert chat is not None
    assert kv_cap(2473 * 16, 16, chat) == 43
    assert kv_cap(64, 16, chat) == 1  # never under one request


def test_a_few_requests_replace_a_known_footprint_only_when_nothing_is_known() -> None:
    """Three answers drawn from 96-160 tokens can look alike (140-152); the footprint of a full window
    stands until as many requests say otherwise, and over an idle spell."""
    spread = [ended(545, output) for output in range(96, 161, 8)]
    known = Footprint.update(None, spread)
    assert known is not None and not known.in_step and known.requests == 9
    few = [ended(545, 140), ended(545, 148), ended(545, 152)]
    assert Footprint.update(known, few) is known
    assert Footprint.update(known, []) is known
    first = Footprint.update(None, few)
    assert first is not None and first.in_step  # nothing better known: the cautious count
    assert Footprint.update(first, spread) == known
