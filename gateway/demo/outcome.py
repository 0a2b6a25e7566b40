"""The demo's ending: the summary table, its headline, and ``demo.json`` (timeline and summary)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from gateway.demo.script import DEMAND_MARGIN, STEADY_SKIP, TOLERANCE
from gateway.demo.summary import MISS, PASS, PhaseSummary
from gateway.demo.timeline import Sample

KIND = "sweetspot.demo"
SCHEMA_VERSION = 1


def _n(value: float | int | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def summary_table(summaries: Sequence[PhaseSummary], *, width: int = 120) -> Table:
    """One row per phase. Under 95 columns the share in band and tokens/s are left out (they are in the
    JSON) so the table still fits an 80-column terminal."""
    wide = width >= 95
    table = Table(
        title="where the controller held (steady part of each phase)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
    )
    columns = [
        ("phase", "left"),
        ("clients", "right"),
        ("sweet\nspot", "right"),
        ("limit\n(min-max)", "right"),
        ("ratio", "right"),
        ("in\nband", "right"),
        ("in-\nflight", "right"),
        ("queued", "right"),
        ("tok/s", "right"),
        ("verdict", "left"),
    ]
    keep = [wide or name not in ("in\nband", "tok/s") for name, _ in columns]
    for (name, justify), kept in zip(columns, keep, strict=True):
        if kept:
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for s in summaries:
        verdict = {PASS: f"[green]{s.verdict}[/]", MISS: f"[bold red]{s.verdict}[/]"}.get(s.verdict, s.verdict)
        cells = [
            s.name,
            str(s.clients),
            _n(s.reference),
            f"{_n(s.limit_median, '{:g}')} ({_n(s.limit_min)}-{_n(s.limit_max)})",
            _n(s.ratio, "{:.2f}"),
            _n(None if s.in_band is None else s.in_band * 100, "{:.0f}%"),
            _n(s.inflight_median),
            _n(s.queued_median),
            _n(s.tokens_per_s_median),
            verdict,
        ]
        table.add_row(*(cell for cell, kept in zip(cells, keep, strict=True) if kept))
    return table


def headline(summaries: Sequence[PhaseSummary], passed: bool | None, controller_seen: bool) -> list[str]:
    lines = [
        f"judged: phases whose clients exceed {DEMAND_MARGIN:g} x their sweet spot (there the limit is the "
        f"bottleneck); the first {STEADY_SKIP:.0%} of each phase is its transition and not counted; "
        f"criterion: median limit within +-{TOLERANCE:.0%} of the sweet spot.",
    ]
    for s in summaries:
        lines.append(f"  {s.name}: {s.note}" + (f" [{s.reference_source}]" if s.judged else ""))
    if not controller_seen:
        lines.append(
            "the gateway reported no controller state: the limit above is its static limit (no AIMD controller ran)"
        )
    if passed is None:
        lines.append("result: no phase was judged")
    elif passed:
        lines.append("result: the controller held within +-25% of the sweet spot in every judged phase")
    else:
        missed = ", ".join(s.name for s in summaries if s.judged and s.verdict == MISS)
        lines.append(f"result: the controller was outside +-25% of the sweet spot in: {missed}")
    return lines


def write_json(
    path: Path,
    *,
    meta: dict[str, Any],
    summaries: Sequence[PhaseSummary],
    passed: bool | None,
    samples: Sequence[Sample],
    decisions: list[Any] | None,
) -> Path:
    document = {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        **meta,
        "criterion": {"tolerance": TOLERANCE, "demand_margin": DEMAND_MARGIN, "steady_skip": STEADY_SKIP},
        "passed": passed,
        "phases": [s.as_dict() for s in summaries],
        "controller_decisions": decisions,
        "timeline": [s.as_dict() for s in samples],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return path
