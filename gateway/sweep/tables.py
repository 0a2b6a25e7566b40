"""Turning a :class:`SweepResult` into things people read: a markdown table, a PNG plot, a rich table.

The three views show the same columns in the same units (tokens/s, ms at p50/p99) and mark the same
rows (sweet spot, peak, cliff), so a table pasted into an issue matches the plot beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from gateway.sweep.result import LevelMetrics, SweepResult, save_sweep_result

COLUMNS = (
    "conc",
    "tok/s",
    "req/s",
    "goodput",
    "TTFT p50/p99",
    "TPOT p50/p99",
    "ITL p99",
    "E2E p99",
    "ok/fail/429+503",
    "SLO",
    "",
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _rate(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def marks(result: SweepResult, level: LevelMetrics) -> str:
    """``sweet spot``, ``peak`` and ``cliff`` labels for a level's row."""
    out = []
    if result.sweet_spot and result.sweet_spot.concurrency == level.concurrency:
        out.append("sweet spot")
    if result.peak_concurrency == level.concurrency:
        out.append("peak")
    if result.cliff and result.cliff.concurrency == level.concurrency:
        out.append("cliff")
    return ", ".join(out)


def row(result: SweepResult, level: LevelMetrics) -> list[str]:
    return [
        str(level.concurrency),
        f"{level.output_tokens_per_s:.1f}",
        _rate(level.requests_per_s),
        _rate(level.goodput_requests_per_s),
        f"{_ms(level.ttft_ms.p50)} / {_ms(level.ttft_ms.p99)}",
        f"{_ms(level.tpot_ms.p50)} / {_ms(level.tpot_ms.p99)}",
        _ms(level.itl_ms.p99),
        _ms(level.e2e_ms.p99),
        f"{level.completed}/{level.failed}/{level.rejected}",
        "yes" if level.slo_met else "no",
        marks(result, level),
    ]


def headline(result: SweepResult) -> list[str]:
    """The answer in a few lines: sweet spot, peak, cliff, and the reason."""
    spot = result.sweet_spot
    lines = [
        f"sweet spot: {spot.concurrency} concurrent requests ({spot.output_tokens_per_s:.0f} tok/s, "
        f"{spot.fraction_of_peak:.0%} of peak)"
        if spot
        else "sweet spot: none found",
        f"peak: {result.peak_tokens_per_s:.0f} tok/s at concurrency {result.peak_concurrency}",
        f"cliff: {result.cliff.reason}" if result.cliff else "cliff: not seen",
        f"why: {result.verdict}",
    ]
    if result.stopped_early:
        lines.append("the sweep stopped early, past the cliff")
    return lines


def markdown(result: SweepResult) -> str:
    s = result.settings
    slo = s.slo
    slo_text = (
        ", ".join(
            f"{name} <= {value:g} ms"
            for name, value in (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms), ("E2E", slo.e2e_ms))
            if value is not None
        )
        or "none"
    )
    workload = s.workload
    lines = [
        f"# Sweep of {result.server.url} ({result.server.model})",
        "",
        *[f"- {line}" for line in headline(result)],
        "",
        f"Mode {s.mode}{f' at {s.rate:g} req/s' if s.rate else ''}; {result.server.api} API; prompt "
        f"{workload.get('prompt_len')} tokens, output {workload.get('output_len')} tokens; SLOs (p99) {slo_text}; "
        f"sweet spot = smallest concurrency at >= {s.fraction:.0%} of peak within the SLOs. Latencies in ms, "
        f"throughput per second of each level's measurement window; tokens counted from {result.token_counting}.",
        "",
        "| " + " | ".join(COLUMNS[:-1]) + " | note |",
        "|" + "|".join("---:" for _ in COLUMNS[:-1]) + "|---|",
    ]
    lines += ["| " + " | ".join(row(result, level)) + " |" for level in result.levels]
    if result.notes:
        lines += ["", *[f"Note: {note}" for note in result.notes]]
    return "\n".join(lines) + "\n"


def rich_table(result: SweepResult) -> Table:
    table = Table(title=f"sweep of {result.server.url} ({result.server.model}); latencies in ms")
    for name in COLUMNS:
        table.add_column(name or "note", justify="left" if name in ("", "SLO") else "right")
    for level in result.levels:
        label = marks(result, level)
        style = "bold green" if "sweet spot" in label else "red" if "cliff" in label else None
        table.add_row(*row(result, level), style=style)
    return table


def plot(result: SweepResult, path: str | Path) -> Path:
    """Tokens/s (top) and p99 TTFT / TPOT (bottom, log scale) against concurrency; SLOs dashed,
    sweet spot and cliff marked with vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = result.levels
    xs = [lv.concurrency for lv in levels]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6.5), constrained_layout=True)
    top.plot(xs, [lv.output_tokens_per_s for lv in levels], "o-", color="tab:blue", label="output tokens/s")
    top.axhline(result.peak_tokens_per_s, color="tab:blue", ls=":", lw=1, label=f"peak {result.peak_tokens_per_s:.0f}")
    top.axhline(
        result.settings.fraction * result.peak_tokens_per_s,
        color="tab:gray",
        ls=":",
        lw=1,
        label=f"{result.settings.fraction:.0%} of peak",
    )
    missed = [(lv.concurrency, lv.output_tokens_per_s) for lv in levels if not lv.slo_met]
    if missed:
        top.plot(*zip(*missed, strict=True), "x", color="tab:red", ms=10, mew=2, label="SLO missed")
    top.set_ylabel("output tokens/s")
    top.set_title(f"{result.server.model} @ {result.server.url}")
    for name, color, key in (("p99 TTFT", "tab:orange", "ttft_ms"), ("p99 TPOT", "tab:purple", "tpot_ms")):
        points = [(lv.concurrency, getattr(lv, key).p99) for lv in levels if getattr(lv, key).p99]
        if points:
            bottom.plot(*zip(*points, strict=True), "o-", color=color, label=name)
        limit = getattr(result.settings.slo, key)
        if limit is not None:
            bottom.axhline(limit, color=color, ls="--", lw=1, label=f"{name} SLO {limit:g} ms")
    bottom.set_yscale("log")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("concurrency (requests in flight)")
    for axis in (top, bottom):
        if result.sweet_spot:
            axis.axvline(result.sweet_spot.concurrency, color="tab:green", lw=2, alpha=0.6)
        if result.cliff:
            axis.axvline(result.cliff.concurrency, color="tab:red", lw=2, alpha=0.6)
        axis.grid(True, alpha=0.3)
    if result.sweet_spot:
        top.annotate(
            f"sweet spot {result.sweet_spot.concurrency}",
            (result.sweet_spot.concurrency, 0.04),
            xycoords=("data", "axes fraction"),
            color="tab:green",
            ha="right",
            rotation=90,
        )
    if result.cliff:
        top.annotate(
            f"cliff {result.cliff.concurrency}",
            (result.cliff.concurrency, 0.04),
            xycoords=("data", "axes fraction"),
            color="tab:red",
            ha="right",
            rotation=90,
        )
    if len(xs) > 1 and xs[-1] / xs[0] >= 8:
        top.set_xscale("log", base=2)
    top.set_xticks(xs, [str(x) for x in xs])
    top.set_ylim(bottom=0)
    top.legend(loc="lower right", fontsize="small")
    bottom.legend(loc="upper left", fontsize="small")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


@dataclass(frozen=True, slots=True)
class ReportFiles:
    json: Path
    markdown: Path
    png: Path


def write_report(result: SweepResult, out_dir: str | Path) -> ReportFiles:
    """Write ``sweep.json``, ``sweep.md`` and ``sweep.png`` into ``out_dir`` (created if missing)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = save_sweep_result(result, out / "sweep.json")
    md_path = out / "sweep.md"
    md_path.write_text(markdown(result), encoding="utf-8")
    return ReportFiles(json=json_path, markdown=md_path, png=plot(result, out / "sweep.png"))
