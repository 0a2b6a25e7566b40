"""The benches' figures are strict JSON: a ratio against a configuration that delivered nothing, or a figure
with no samples, is written as null, which every parser reads; and every recorded run in docs/ is such JSON."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench._json import dumps, finite, strict_loads, write_json

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_non_finite_figures_become_null_at_any_depth() -> None:
    payload = {"ratio": {"static 22": math.inf, "static 11": 0.98}, "runs": [(1.0, -math.inf), [math.nan]], "n": 3}
    assert finite(payload) == {"ratio": {"static 22": None, "static 11": 0.98}, "runs": [[1.0, None], [None]], "n": 3}


def test_written_file_reads_back_strictly(tmp_path: Path) -> None:
    out = tmp_path / "deeper" / "figures.json"
    write_json(out, {"goodput": math.inf, "throughput": 21.503, "label": "static 16"})
    text = out.read_text()
    assert text.endswith("\n")
    assert strict_loads(text) == {"goodput": None, "throughput": 21.503, "label": "static 16"}
    assert strict_loads(dumps([math.nan], indent=None)) == [None]


def test_strict_reader_refuses_pythons_extensions() -> None:
    with pytest.raises(ValueError, match="Infinity is not JSON"):
        strict_loads('{"goodput": Infinity}')


@pytest.mark.parametrize("path", sorted(DOCS.glob("*.json")), ids=lambda p: p.name)
def test_every_recorded_run_in_docs_is_strict_json(path: Path) -> None:
    strict_loads(path.read_text())
