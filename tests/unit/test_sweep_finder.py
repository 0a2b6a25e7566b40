"""The sweet-spot finder on synthetic levels: peak, sweet spot, SLO filtering, cliff detection."""

from __future__ import annotations

import pytest

from gateway.sweep.finder import detect_cliff, find_sweet_spot, judge, slo_violations
from gateway.sweep.result import SLO, LevelMetrics, Stats

# Tokens/s and p99 TPOT (ms) shaped like the simulator's default profile (knee near 17, ~1,290 peak).
CURVE = {
    1: (75, 13),
    2: (150, 13),
    4: (300, 13),
    8: (590, 14),
    16: (990, 16),
    24: (1165, 21),
    32: (1230, 26),
    48: (1270, 38),
    64: (1280, 50),
}


def level(
    c: int, tps: float, *, ttft: float = 200.0, tpot: float = 20.0, error_rate: float = 0.0, completed: int = 50
) -> LevelMetrics:
    return LevelMetrics(
        concurrency=c,
        output_tokens_per_s=tps,
        completed=completed,
        requests=completed,
        error_rate=error_rate,
        ttft_ms=Stats(count=1, p99=ttft),
        tpot_ms=Stats(count=1, p99=tpot),
    )


def curve(**overrides: float) -> list[LevelMetrics]:
    return [level(c, overrides.get(f"c{c}", tps), tpot=tpot) for c, (tps, tpot) in CURVE.items()]


def test_sweet_spot_is_smallest_level_reaching_the_fraction() -> None:
    verdict = find_sweet_spot(curve(), slo=SLO(), fraction=0.9)
    assert verdict.peak_tokens_per_s == 1280 and verdict.peak_concurrency == 64
    # 0.9 x 1280 = 1152: 16 (990) falls short, 24 (1165) reaches it
    assert verdict.sweet_spot is not None and verdict.sweet_spot.concurrency == 24
    assert verdict.sweet_spot.fraction_of_peak == pytest.approx(1165 / 1280)
    assert verdict.cliff is None


def test_lower_fraction_moves_the_sweet_spot_down() -> None:
    verdict = find_sweet_spot(curve(), slo=SLO(), fraction=0.75)  # 960: reached at 16
    assert verdict.sweet_spot is not None and verdict.sweet_spot.concurrency == 16


def test_tpot_slo_filters_levels() -> None:
    verdict = find_sweet_spot(curve(), slo=SLO(tpot_ms=20), fraction=0.9)  # 24 has p99 TPOT 21 ms
    assert verdict.sweet_spot is None
    assert "best within them was concurrency 16" in verdict.reason


def test_disabled_slos_do_not_filter() -> None:
    levels = [level(c, tps, tpot=5000, ttft=60000) for c, (tps, _) in CURVE.items()]
    assert find_sweet_spot(levels, slo=SLO(ttft_ms=None, tpot_ms=None), fraction=0.9).sweet_spot.concurrency == 24
    assert find_sweet_spot(levels, slo=SLO(), fraction=0.9).sweet_spot is None


def test_ttft_slo_violation_is_named() -> None:
    lv = level(8, 500, ttft=2500)
    assert slo_violations(lv, SLO()) == ["p99 TTFT 2500 ms > 2000 ms"]
    judged = judge(lv, SLO())
    assert judged.slo_met is False and judged.slo_violations == ["p99 TTFT 2500 ms > 2000 ms"]
    assert judge(lv, SLO(ttft_ms=None)).slo_met is True


def test_throughput_cliff_and_sweet_spot_before_it() -> None:
    levels = curve(c48=900, c64=700)  # 900 is 27% below the 1230 of concurrency 32
    cliff = detect_cliff(levels, tolerance=0.1, max_error_rate=0.01)
    assert cliff is not None and cliff.concurrency == 48 and cliff.kind == "throughput_drop"
    assert cliff.best_before_concurrency == 32 and cliff.best_before_tokens_per_s == 1230
    verdict = find_sweet_spot(levels, slo=SLO(), fraction=0.9, tolerance=0.1)
    assert verdict.peak_concurrency == 32  # 0.9 x 1230 = 1107: 24 reaches it
    assert verdict.sweet_spot is not None and verdict.sweet_spot.concurrency == 24


def test_small_dips_within_tolerance_are_not_a_cliff() -> None:
    assert detect_cliff(curve(c48=1150), tolerance=0.1, max_error_rate=0.01) is None  # -6.5% of 1230


def test_errors_make_a_cliff() -> None:
    levels = curve()
    levels[6] = level(32, 1230, error_rate=0.05)
    cliff = detect_cliff(levels, tolerance=0.1, max_error_rate=0.01)
    assert cliff is not None and cliff.kind == "errors" and cliff.concurrency == 32
    verdict = find_sweet_spot(levels, slo=SLO(), fraction=0.9, max_error_rate=0.01)
    assert verdict.sweet_spot is not None and verdict.sweet_spot.concurrency == 24


def test_no_sweet_spot_past_the_cliff() -> None:
    levels = [level(1, 100), level(2, 120), level(4, 50), level(8, 300)]
    verdict = find_sweet_spot(levels, slo=SLO(), fraction=0.9, tolerance=0.1)
    assert verdict.cliff is not None and verdict.cliff.concurrency == 4
    assert verdict.peak_concurrency == 8
    assert verdict.sweet_spot is None


def test_peak_ties_go_to_the_smaller_concurrency_and_empty_levels_are_ignored() -> None:
    levels = [level(1, 0.0, completed=0), level(2, 500), level(4, 500)]
    verdict = find_sweet_spot(levels, slo=SLO(), fraction=1.0)
    assert verdict.peak_concurrency == 2 and verdict.sweet_spot.concurrency == 2
    assert find_sweet_spot([level(1, 0.0, completed=0)], slo=SLO()).peak_concurrency is None


def test_a_level_that_completed_nothing_in_its_time_limit_is_a_cliff() -> None:
    stuck = LevelMetrics(concurrency=8, timed_out=True)
    cliff = detect_cliff([level(1, 100), level(4, 380), stuck], tolerance=0.5, max_error_rate=0.01)
    assert cliff is not None and cliff.concurrency == 8 and cliff.kind == "errors"
    assert cliff.best_before_concurrency == 4
