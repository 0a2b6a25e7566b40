"""Where the controller starts: a sweep result's sweet spot and the part of its curve below the peak."""

from __future__ import annotations

from pathlib import Path

from gateway.server.feedback.start_points import load_start_points, start_point
from gateway.sweep.result import LevelMetrics, ServerInfo, SweepResult, SweepSettings, SweetSpot, save_sweep_result


def sweep(url: str = "http://127.0.0.1:8000") -> SweepResult:
    levels = [
        LevelMetrics(concurrency=c, output_tokens_per_s=r, failed=f)
        for c, r, f in ((16, 1770.0, 0), (24, 2092.0, 1), (32, 2245.0, 0), (48, 2345.0, 0), (64, 2000.0, 0))
    ]
    return SweepResult(
        server=ServerInfo(url=url, api="chat", model="m"),
        settings=SweepSettings(levels=[16, 24, 32, 48, 64]),
        levels=levels,
        peak_tokens_per_s=2345.0,
        peak_concurrency=48,
        sweet_spot=SweetSpot(concurrency=32, output_tokens_per_s=2245.0, fraction_of_peak=0.96),
        cliff=None,
        verdict="test",
    )


def test_start_point_from_a_sweep_carries_its_levels_up_to_the_peak() -> None:
    start = start_point(sweep())
    assert start is not None and start.limit == 32 and start.peak_tokens_per_s == 2345.0
    assert start.levels == ((16, 1770.0), (32, 2245.0), (48, 2345.0))  # no failed level, none past the peak


def test_a_sweep_without_a_sweet_spot_gives_no_start_point() -> None:
    assert start_point(sweep().model_copy(update={"sweet_spot": None})) is None


def test_the_swept_upstream_starts_there_and_any_upstream_when_the_sweep_measured_another(tmp_path: Path) -> None:
    path = save_sweep_result(sweep("http://a:8000/"), tmp_path / "sweep.json")
    assert list(load_start_points(path, ["http://a:8000", "http://b:8000"])) == ["http://a:8000"]
    assert list(load_start_points(path, ["http://c:8000", "http://d:8000"])) == ["http://c:8000", "http://d:8000"]
    assert load_start_points(None, ["http://a:8000"]) == {}
