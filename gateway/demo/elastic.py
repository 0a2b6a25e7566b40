"""The elastic variant's ending (``sweetspot demo --elastic``): the pool and each upstream per phase, and the join.

Pure: everything comes from the timeline. Per phase, as in the default summary, only the steady part counts
(the first ``STEADY_SKIP`` of a phase is its transition). The join is read off the timeline too: the first
sample whose ``/state`` lists the new upstream is when it joined, its limit there is the limit it started at,
and the pool *before* (the steady part of the phase before the join's) is set against the pool *after* (the
steady part of the join's phase): tokens/s, the gateway's queue, client p99 TTFT, and the capacity signal's
desired figure against the upstreams serving.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rich import box
from rich.table import Table

from gateway.demo.script import STEADY_SKIP, Phase
from gateway.demo.timeline import Sample


@dataclass(frozen=True, slots=True)
class Stretch:
    """The pool over a stretch of the timeline: medians, and the last reading of the signal."""

    from_s: float
    to_s: float
    samples: int
    serving: int | None  # the upstreams /state listed, last sample
    desired: int | None  # sweetspot_upstreams_desired, last sample that had it
    demand_requests_per_s: float | None
    pool_requests_per_s: float | None  # one backend's capacity (the pool's median), last reading
    queued_median: float | None
    queued_max: int | None
    tokens_per_s_median: float | None  # what the clients received
    client_ttft_p99_ms_median: float | None
    failed: int
    rejected: int


@dataclass(frozen=True, slots=True)
class PoolPhase:
    name: str
    arrivals_per_s: float | None
    start_s: float
    end_s: float
    steady: Stretch


@dataclass(frozen=True, slots=True)
class UpstreamPhase:
    """One upstream over one phase's steady part."""

    phase: str
    label: str
    url: str
    samples: int
    limit_median: float | None
    limit_min: int | None
    limit_max: int | None
    inflight_median: float | None
    tokens_per_s_median: float | None  # the gateway window's, for this upstream
    capacity_requests_per_s: float | None  # its measured capacity, last reading in the phase
    capacity_tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class Join:
    label: str
    url: str
    phase: str
    written_at_s: float | None  # when the demo listed it in the upstreams file
    joined_at_s: float | None  # the first sample whose /state lists it; None: it never appeared
    start_limit: int | None  # its limit in that sample
    sibling_limit: int | None  # the median (low) of the others' limits just before it joined
    before: Stretch | None  # the steady part of the phase before the join's
    after: Stretch | None  # the steady part of the join's phase

    @property
    def delay_s(self) -> float | None:
        if self.joined_at_s is None or self.written_at_s is None:
            return None
        return self.joined_at_s - self.written_at_s


@dataclass(frozen=True, slots=True)
class ElasticSummary:
    pool: list[PoolPhase]
    upstreams: list[UpstreamPhase]
    joins: list[Join]
    failed: int  # client requests that failed over the whole load

    def as_dict(self) -> dict[str, Any]:
        document = asdict(self)
        for join, entry in zip(self.joins, document["joins"], strict=True):
            entry["delay_s"] = None if join.delay_s is None else round(join.delay_s, 2)
        return document


def _median(values: Sequence[float | int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def _last(values: Sequence[Any]) -> Any:
    return next((v for v in reversed(values) if v is not None), None)


def stretch(samples: Sequence[Sample], previous: Sample | None = None) -> Stretch | None:
    """The pool over ``samples`` (in time order); failures counted from ``previous`` (else the first)."""
    if not samples:
        return None
    signals = [s.signal for s in samples if s.signal is not None]
    before = previous or samples[0]
    return Stretch(
        from_s=samples[0].t,
        to_s=samples[-1].t,
        samples=len(samples),
        serving=len(samples[-1].upstreams) if samples[-1].upstreams else None,
        desired=_last([g.desired for g in signals]),
        demand_requests_per_s=_median([g.demand_requests_per_s for g in signals]),
        pool_requests_per_s=_last([g.pool_requests_per_s for g in signals]),
        queued_median=_median([s.queued for s in samples]),
        queued_max=max((s.queued for s in samples if s.queued is not None), default=None),
        tokens_per_s_median=_median([s.tokens_per_s for s in samples]),
        client_ttft_p99_ms_median=_median([s.client_ttft_p99_ms for s in samples]),
        failed=samples[-1].failed - before.failed,
        rejected=samples[-1].rejected - before.rejected,
    )


def _steady(samples: Sequence[Sample], index: int) -> tuple[list[Sample], Sample | None]:
    """A phase's steady samples, and the sample before the phase (for counters)."""
    mine = [s for s in samples if s.phase == index]
    if not mine:
        return [], None
    start, end = mine[0].t, mine[-1].t
    steady_from = start + STEADY_SKIP * (end - start)
    earlier = [s for s in samples if s.phase < index]
    return [s for s in mine if s.t >= steady_from], (earlier[-1] if earlier else None)


def upstream_phases(name: str, steady: Sequence[Sample]) -> list[UpstreamPhase]:
    """Each upstream seen in ``steady`` (in the order they first appear), over those samples."""
    order: dict[str, str] = {}
    for s in steady:
        for u in s.upstreams:
            order.setdefault(u.label, u.url)
    rows = []
    for label, url in order.items():
        mine = [u for s in steady for u in s.upstreams if u.label == label]
        limits = [u.limit for u in mine if u.limit is not None]
        rows.append(
            UpstreamPhase(
                phase=name,
                label=label,
                url=url,
                samples=len(mine),
                limit_median=_median(limits),
                limit_min=min(limits) if limits else None,
                limit_max=max(limits) if limits else None,
                inflight_median=_median([u.inflight for u in mine]),
                tokens_per_s_median=_median([u.tokens_per_s for u in mine]),
                capacity_requests_per_s=_last([u.capacity_requests_per_s for u in mine]),
                capacity_tokens_per_s=_last([u.capacity_tokens_per_s for u in mine]),
            )
        )
    return rows


def find_join(
    samples: Sequence[Sample], label: str, written_at_s: float | None
) -> tuple[float | None, int | None, int | None]:
    """(when ``label`` first appears in the timeline, its limit there, the others' median limit just before)."""
    previous: Sample | None = None
    for s in samples:
        entry = next((u for u in s.upstreams if u.label == label), None)
        if entry is not None and (written_at_s is None or s.t >= written_at_s):
            base = previous if previous is not None else s
            others = [u.limit for u in base.upstreams if u.label != label and u.limit is not None]
            return s.t, entry.limit, (int(statistics.median_low(others)) if others else None)
        previous = s
    return None, None, None


def summarize_elastic(
    phases: Sequence[Phase],
    samples: Sequence[Sample],
    arrivals: Sequence[float | None],
    joiners: dict[int, tuple[str, str]],
    written_at: dict[int, float],
) -> ElasticSummary:
    """``joiners``: phase index -> (label, url) of the upstream that joins as it starts; ``written_at``: phase
    index -> when the demo listed it in the upstreams file (seconds since the load began)."""
    pool: list[PoolPhase] = []
    upstreams: list[UpstreamPhase] = []
    steady_by_phase: dict[int, Stretch | None] = {}
    for index, (phase, rate) in enumerate(zip(phases, arrivals, strict=True)):
        mine = [s for s in samples if s.phase == index]
        if not mine:
            break
        steady, previous = _steady(samples, index)
        whole = stretch(steady, previous)
        steady_by_phase[index] = whole
        if whole is not None:
            pool.append(PoolPhase(phase.name, rate, mine[0].t, mine[-1].t, whole))
        upstreams += upstream_phases(phase.name, steady)
    joins = []
    for index, (label, url) in sorted(joiners.items()):
        if index >= len(pool):
            break
        joined_at, start_limit, sibling = find_join(samples, label, written_at.get(index))
        joins.append(
            Join(
                label=label,
                url=url,
                phase=phases[index].name,
                written_at_s=written_at.get(index),
                joined_at_s=joined_at,
                start_limit=start_limit,
                sibling_limit=sibling,
                before=steady_by_phase.get(index - 1),
                after=steady_by_phase.get(index),
            )
        )
    return ElasticSummary(pool, upstreams, joins, failed=samples[-1].failed if samples else 0)


# --- the tables and the lines under them ------------------------------------------------------------


def _n(value: float | int | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _table(title: str, columns: Sequence[tuple[str, str]]) -> Table:
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    return table


def pool_table(summary: ElasticSummary) -> Table:
    """One row per phase: the load, the upstreams against the capacity signal, the queue, what clients got."""
    table = _table(
        "the pool (steady part of each phase)",
        [
            ("phase", "left"),
            ("arrivals\n/s", "right"),
            ("serving", "right"),
            ("desired", "right"),
            ("demand\n/s", "right"),
            ("one backend\nreq/s", "right"),
            ("queued\n(max)", "right"),
            ("tok/s", "right"),
            ("p99 TTFT\nclients", "right"),
            ("failed", "right"),
        ],
    )
    for p in summary.pool:
        s = p.steady
        table.add_row(
            p.name,
            _n(p.arrivals_per_s, "{:.1f}"),
            _n(s.serving),
            _n(s.desired),
            _n(s.demand_requests_per_s, "{:.1f}"),
            _n(s.pool_requests_per_s, "{:.1f}"),
            f"{_n(s.queued_median)} ({_n(s.queued_max)})",
            _n(s.tokens_per_s_median),
            _n(s.client_ttft_p99_ms_median, "{:.0f} ms"),
            str(s.failed),
        )
    return table


def upstream_table(summary: ElasticSummary) -> Table:
    """One row per phase and upstream."""
    table = _table(
        "each upstream (steady part of each phase)",
        [
            ("phase", "left"),
            ("upstream", "left"),
            ("limit\n(min-max)", "right"),
            ("in-\nflight", "right"),
            ("tok/s", "right"),
            ("capacity\nreq/s", "right"),
            ("capacity\ntok/s", "right"),
        ],
    )
    for u in summary.upstreams:
        table.add_row(
            u.phase,
            u.label,
            f"{_n(u.limit_median, '{:g}')} ({_n(u.limit_min)}-{_n(u.limit_max)})",
            _n(u.inflight_median),
            _n(u.tokens_per_s_median),
            _n(u.capacity_requests_per_s, "{:.1f}"),
            _n(u.capacity_tokens_per_s),
        )
    return table


def _stretch_text(s: Stretch) -> str:
    signal = (
        f"desired {s.desired} for {_n(s.serving)} serving"
        if s.desired is not None
        else f"{_n(s.serving)} serving, no desired figure yet (no backend measured at its limit)"
    )
    return (
        f"{signal}; {_n(s.tokens_per_s_median)} tok/s, {_n(s.queued_median)} queued (median), "
        f"client p99 TTFT {_n(s.client_ttft_p99_ms_median)} ms"
    )


def join_lines(summary: ElasticSummary, file_name: str, interval_s: float | None) -> list[str]:
    """What the join did, then the result."""
    lines: list[str] = []
    every = f" (checked every {interval_s:g} s)" if interval_s else ""
    for j in summary.joins:
        if j.joined_at_s is None:
            lines.append(f"{j.label} ({j.url}) was listed in {file_name} but never appeared in the gateway's /state")
            continue
        after = f", {j.delay_s:.1f} s after the demo listed it in {file_name}{every}" if j.delay_s is not None else ""
        start = (
            f"its controller started at limit {_n(j.start_limit)}"
            + (f", its siblings' median limit then ({j.sibling_limit})" if j.sibling_limit is not None else "")
            + ", not in slow start"
        )
        lines.append(f"{j.label} joined at {j.joined_at_s:.1f} s{after}, without a restart; {start}")
        if j.before is not None:
            lines.append(f"  before ({summary_phase_before(summary, j)}): {_stretch_text(j.before)}")
        if j.after is not None:
            ratio = ""
            if j.before and j.before.tokens_per_s_median and j.after.tokens_per_s_median:
                ratio = f" ({j.after.tokens_per_s_median / j.before.tokens_per_s_median:.2f}x the tokens/s)"
            lines.append(f"  after ({j.phase}): {_stretch_text(j.after)}{ratio}")
    joined = [j for j in summary.joins if j.joined_at_s is not None]
    if not summary.joins:
        lines.append("result: no phase with a join was reached")
    elif len(joined) < len(summary.joins):
        lines.append("result: an upstream listed in the file did not join")
    else:
        lines.append(
            f"result: {', '.join(j.label for j in joined)} joined the running gateway; "
            + ("no client request failed" if summary.failed == 0 else f"{summary.failed} client requests failed")
        )
    return lines


def summary_phase_before(summary: ElasticSummary, join: Join) -> str:
    names = [p.name for p in summary.pool]
    index = names.index(join.phase) if join.phase in names else 0
    return names[index - 1] if index > 0 else "-"
