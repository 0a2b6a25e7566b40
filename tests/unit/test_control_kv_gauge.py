"""A KV gauge that reads a full cache while tokens flow and nothing is preempted contradicts itself: the
controller treats it as missing (``gateway.control.knee_search.kv_gauge``), so it keeps its limit on the
request path's signals instead of cutting it to the minimum; a cache that really fills still counts."""

from __future__ import annotations

from dataclasses import replace

from gateway.control.algorithm import Action, Reason
from gateway.control.config import AimdConfig
from gateway.control.knee_search.aimd import Aimd
from gateway.control.knee_search.kv_gauge import FULL_SCRAPES, KvGauge
from gateway.control.observation import Observation
from tests.unit.test_control_aimd import Drive, blank

CONFIG = AimdConfig()


def scrape(now: float, kv: float, *, tokens_per_s: float = 500.0, preemptions: float = 0.0) -> Observation:
    return replace(
        blank(now), kv_usage=kv, kv_usage_age_s=0.5, tokens_per_s=tokens_per_s, preemptions_total=preemptions
    )


def test_a_full_cache_that_makes_tokens_without_preempting_is_untrusted_after_a_few_scrapes() -> None:
    gauge = KvGauge()
    vetted = [gauge.vet(scrape(2.0 * i, 1.0)) for i in range(1, FULL_SCRAPES + 2)]
    assert [o.kv_usage for o in vetted] == [1.0] * (FULL_SCRAPES - 1) + [None, None]
    assert vetted[-1].kv_usage_age_s is None
    assert gauge.vet(scrape(20.0, 0.7)).kv_usage == 0.7  # it moved: trusted again at once


def test_the_same_scrape_seen_twice_counts_once() -> None:
    gauge = KvGauge()
    for i in range(1, FULL_SCRAPES):
        gauge.vet(scrape(2.0 * i, 1.0))
        gauge.vet(replace(scrape(2.0 * i, 1.0), now=2.0 * i + 0.25, kv_usage_age_s=0.75))  # a tick between scrapes
    assert not gauge.untrusted


def test_a_full_cache_that_preempts_or_makes_no_tokens_stays_trusted() -> None:
    preempting = KvGauge()
    for i in range(1, 3 * FULL_SCRAPES):
        assert preempting.vet(scrape(2.0 * i, 1.0, preemptions=float(i))).kv_usage == 1.0
    idle = KvGauge()
    for i in range(1, 3 * FULL_SCRAPES):
        assert idle.vet(scrape(2.0 * i, 1.0, tokens_per_s=0.0)).kv_usage == 1.0


def test_a_high_reading_under_full_is_not_judged() -> None:
    gauge = KvGauge()
    for i in range(1, 3 * FULL_SCRAPES):
        assert gauge.vet(scrape(2.0 * i, 0.99)).kv_usage == 0.99


def test_a_kv_gauge_stuck_at_one_costs_one_cut_not_the_limit() -> None:
    """Before: a KV reading of 1.0 cut the limit by kv_usage_resume once per window, down to its minimum
    (the kv_reads_one scenario's goodput fell under half the best static limit's)."""
    drive = Drive(Aimd(CONFIG, initial_limit=8))
    drive.run(200)
    settled = drive.aimd.limit
    lied = drive.run(200, kv_usage=1.0, kv_usage_age_s=0.5, backend_running=lambda d: d.aimd.limit)
    cuts = [d for d in lied if d.action is Action.DECREASE and d.reason is Reason.KV_USAGE]
    assert len(cuts) <= 1
    assert drive.aimd.limit >= 0.8 * settled
    assert lied[-1].inputs.get("kv_untrusted") is True


def test_a_full_cache_that_preempts_still_cuts() -> None:
    drive = Drive(Aimd(CONFIG, initial_limit=8))
    drive.run(200)
    settled = drive.aimd.limit
    drive.run(
        60,
        kv_usage=1.0,
        kv_usage_age_s=0.5,
        backend_running=lambda d: d.aimd.limit,
        preemptions_total=lambda d: d.now,
        preemptions_age_s=0.5,
    )
    assert drive.aimd.limit < 0.8 * settled
