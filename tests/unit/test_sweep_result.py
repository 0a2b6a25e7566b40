"""The sweep result file: round trip, schema validation on load, and the reports written from it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from gateway.sweep.finder import find_sweet_spot, judge
from gateway.sweep.result import (
    SLO,
    LevelMetrics,
    ServerInfo,
    Stats,
    SweepResult,
    SweepResultError,
    SweepSettings,
    load_sweep_result,
)
from gateway.sweep.tables import markdown, write_report


def synthetic_result() -> SweepResult:
    slo = SLO()
    levels = [
        judge(
            LevelMetrics(
                concurrency=c,
                output_tokens_per_s=tps,
                completed=40,
                requests=40,
                ttft_ms=Stats(count=40, p50=100, p99=ttft),
                tpot_ms=Stats(count=40, p50=tpot, p99=tpot),
            ),
            slo,
        )
        for c, tps, ttft, tpot in [
            (1, 75, 90, 13),
            (8, 590, 120, 14),
            (16, 990, 200, 16),
            (24, 1165, 300, 21),
            (32, 1230, 400, 26),
            (48, 800, 3000, 60),
        ]
    ]
    verdict = find_sweet_spot(levels, slo=slo)
    return SweepResult(
        server=ServerInfo(url="http://127.0.0.1:8000", api="chat", model="m"),
        settings=SweepSettings(levels=[1, 8, 16, 24, 32, 48], slo=slo),
        levels=levels,
        peak_tokens_per_s=verdict.peak_tokens_per_s,
        peak_concurrency=verdict.peak_concurrency,
        sweet_spot=verdict.sweet_spot,
        cliff=verdict.cliff,
        verdict=verdict.reason,
        stopped_early=True,
    )


def test_round_trip_and_report_files(tmp_path: Path) -> None:
    result = synthetic_result()
    files = write_report(result, tmp_path / "out")
    loaded = load_sweep_result(files.json)
    assert loaded == result
    assert loaded.sweet_spot is not None and loaded.sweet_spot.concurrency == 24
    assert loaded.peak_tokens_per_s == 1230 and loaded.cliff is not None and loaded.cliff.concurrency == 48
    assert files.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = files.markdown.read_text()
    assert "| 24 | 1165.0 |" in table and "sweet spot" in table and "| 48 |" in table and "cliff" in table
    # the file also satisfies the published JSON schema of the model
    jsonschema.validate(json.loads(files.json.read_text()), SweepResult.model_json_schema())


def test_markdown_shows_slo_failures() -> None:
    text = markdown(synthetic_result())
    row_48 = next(line for line in text.splitlines() if line.startswith("| 48 |"))
    assert "| no |" in row_48


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(kind="something.else"), "not a sweetspot sweep result"),
        (lambda d: d.update(schema_version=2), "schema_version 2"),
        (lambda d: d.pop("peak_tokens_per_s"), "does not match"),
        (lambda d: d["levels"][0].update(concurrency=0), "does not match"),
        (lambda d: d.update(surprise=1), "does not match"),
    ],
)
def test_load_rejects_bad_files(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(synthetic_result().to_json())
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SweepResultError, match=message):
        load_sweep_result(path)


def test_load_reports_missing_and_non_json_files(tmp_path: Path) -> None:
    with pytest.raises(SweepResultError, match="cannot read"):
        load_sweep_result(tmp_path / "absent.json")
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(SweepResultError, match="not JSON"):
        load_sweep_result(tmp_path / "x.json")
