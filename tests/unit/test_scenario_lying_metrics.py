"""What the scenario harness's backend ``/metrics`` say in each ``Conditions.metrics`` mode (issue 38, item 5):
the lies the ``metrics_missing``, ``kv_reads_zero`` and ``kv_reads_one`` scenarios put the controller through."""

from __future__ import annotations

import pytest

from gateway.control.config import AimdConfig
from gateway.sim.profiles import get_profile
from testbed.scenarios.catalogue import CHAT, QWEN
from testbed.scenarios.harness import Conditions, Harness


def after(mode: str) -> Harness:
    harness = Harness(get_profile(QWEN), AimdConfig(), seed=1)
    harness.run_phase(Conditions((40,), CHAT), 20)
    harness.run_phase(Conditions((40,), CHAT, metrics=mode), 10)
    return harness


@pytest.mark.parametrize(("mode", "kv"), [("kv_zero", 0.0), ("kv_one", 1.0)])
def test_a_lying_kv_gauge_reads_its_constant_and_the_rest_stays_true(mode: str, kv: float) -> None:
    harness = after(mode)
    headroom, engine = harness._headroom, harness.engine
    assert 0.0 < engine.kv_usage < 1.0
    assert headroom.kv_usage == kv
    assert headroom.backend_at is not None and harness.now - headroom.backend_at <= harness.scrape_interval_s
    assert headroom.backend_running is not None and headroom.generation_tokens_total is not None
    assert harness._kv_published is not None


def test_missing_metrics_carry_no_figures_and_no_cache_size() -> None:
    harness = after("missing")
    headroom = harness._headroom
    assert (headroom.kv_usage, headroom.backend_waiting, headroom.preemptions_total) == (None, None, None)
    assert headroom.generation_tokens_total is None and headroom.backend_at is None
    assert harness._kv_published is None


def test_frozen_metrics_keep_the_last_scrape_as_it_ages() -> None:
    harness = after("frozen")
    assert harness._headroom.backend_at is not None and harness.now - harness._headroom.backend_at >= 8.0
