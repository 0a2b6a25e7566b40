"""The demo's picture: limit, in-flight, queued and tokens/s over time, phases marked (matplotlib Agg).

Top: the concurrency limit against what the clients offered (clients), what the backend ran
(in-flight) and what waited in the gateway (queued), with each phase's reference sweet spot drawn as a
band of the tolerance around it (solid where the phase is judged, faint where it is not). Bottom: the
tokens per second the clients received. Vertical lines are the phase boundaries, named at the top.
The elastic variant has its own picture (:func:`plot_elastic`): one limit and in-flight per upstream, the
capacity signal between, the join marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.demo.elastic import ElasticSummary
from gateway.demo.script import TOLERANCE, Phase
from gateway.demo.summary import PhaseSummary
from gateway.demo.timeline import Sample

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _series(samples: Sequence[Sample], name: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for s in samples:
        value = getattr(s, name)
        if value is not None:
            xs.append(s.t)
            ys.append(float(value))
    return xs, ys


def _name_phase(ax: Axes, name: str, start_s: float, end_s: float) -> None:
    """A phase's name above the panel ``ax``, centred on the phase."""
    ax.annotate(
        name,
        xy=((start_s + end_s) / 2, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(0, 4),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=8,
    )


def _save(fig: Figure, title: str, path: str | Path) -> Path:
    """Title ``fig``, write it to ``path`` (its folder made) and close it."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def plot_timeline(
    samples: Sequence[Sample],
    phases: Sequence[Phase],
    summaries: Sequence[PhaseSummary],
    path: str | Path,
    *,
    title: str,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for name, label, style in (
        ("clients", "clients", {"color": "0.6", "linestyle": ":", "drawstyle": "steps-post"}),
        ("queued", "queued (gateway)", {"color": "tab:orange"}),
        # wide and pale under the limit: in-flight sits on the limit whenever the limit binds
        ("inflight", "in-flight (backend)", {"color": "tab:blue", "alpha": 0.4, "linewidth": 5}),
        ("limit", "limit", {"color": "black", "linewidth": 2, "drawstyle": "steps-post"}),
    ):
        xs, ys = _series(samples, name)
        if xs:
            top.plot(xs, ys, label=label, **style)
    for summary in summaries:
        if summary.reference is None:
            continue
        ref = summary.reference
        alpha = 0.25 if summary.judged else 0.08
        top.fill_between(
            [summary.start_s, summary.end_s],
            ref * (1 - TOLERANCE),
            ref * (1 + TOLERANCE),
            color="tab:green",
            alpha=alpha,
            linewidth=0,
        )
        top.hlines(ref, summary.start_s, summary.end_s, colors="tab:green", linestyles="--", linewidth=1)
    top.plot([], [], color="tab:green", linestyle="--", label=f"sweet spot +-{TOLERANCE:.0%} (judged: darker)")
    top.set_ylabel("requests")
    top.set_ylim(bottom=0)
    top.legend(loc="upper right", fontsize=8)
    top.grid(alpha=0.3)

    xs, ys = _series(samples, "tokens_per_s")
    bottom.plot(xs, ys, color="tab:purple", label="tokens/s (clients)")
    bottom.set_ylabel("output tokens/s")
    bottom.set_xlabel("seconds since the load began")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper right", fontsize=8)

    starts = [s.start_s for s in summaries]
    for ax in (top, bottom):
        for start in starts[1:]:
            ax.axvline(start, color="0.3", linewidth=0.8, linestyle="-")
    for summary, phase in zip(summaries, phases, strict=False):  # an interrupted demo summarised fewer phases
        label = phase.name + (f" ({phase.speed_factor:g}x slow)" if phase.speed_factor != 1.0 else "")
        _name_phase(top, label, summary.start_s, summary.end_s)
    return _save(fig, title, path)


def plot_elastic(
    samples: Sequence[Sample],
    summary: ElasticSummary,
    path: str | Path,
    *,
    title: str,
) -> Path:
    """The elastic variant: each upstream's limit and in-flight and the gateway's queue; the capacity signal's
    desired figure against the upstreams serving; tokens/s, the clients' and each upstream's. The join marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, middle, bottom) = plt.subplots(
        3, 1, figsize=(11, 8.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.4, 2]}
    )
    labels = list(dict.fromkeys(u.label for s in samples for u in s.upstreams))
    colours = dict(zip(labels, ("tab:blue", "tab:red", "tab:green", "tab:brown"), strict=False))

    def per_upstream(label: str, name: str) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for s in samples:
            for u in s.upstreams:
                value = getattr(u, name)
                if u.label == label and value is not None:
                    xs.append(s.t)
                    ys.append(float(value))
        return xs, ys

    for label in labels:
        colour = colours.get(label, "0.4")
        top.plot(*per_upstream(label, "inflight"), color=colour, alpha=0.3, linewidth=5, label=f"in-flight {label}")
        top.plot(
            *per_upstream(label, "limit"), color=colour, linewidth=2, drawstyle="steps-post", label=f"limit {label}"
        )
        bottom.plot(
            *per_upstream(label, "tokens_per_s"), color=colour, linewidth=1, label=f"tokens/s {label} (gateway)"
        )
    xs, ys = _series(samples, "queued")
    top.plot(xs, ys, color="tab:orange", label="queued (gateway)")
    top.set_ylabel("requests")
    top.set_ylim(bottom=0)

    for name, label, style in (
        ("desired", "sweetspot_upstreams_desired", {"color": "black", "linewidth": 2}),
        ("serving", "upstreams serving", {"color": "tab:blue", "linestyle": "--"}),
    ):
        points = [(s.t, getattr(s.signal, name)) for s in samples if s.signal and getattr(s.signal, name) is not None]
        if points:
            middle.plot(*zip(*points, strict=True), drawstyle="steps-post", label=label, **style)
    middle.set_ylabel("backends")
    middle.set_ylim(0, max([3] + [s.signal.desired + 1 for s in samples if s.signal and s.signal.desired]))
    middle.yaxis.get_major_locator().set_params(integer=True)

    xs, ys = _series(samples, "tokens_per_s")
    bottom.plot(xs, ys, color="tab:purple", linewidth=2, label="tokens/s (clients)")
    bottom.set_ylabel("output tokens/s")
    bottom.set_xlabel("seconds since the load began")
    bottom.set_ylim(bottom=0)

    for ax in (top, middle, bottom):
        for p in summary.pool[1:]:
            ax.axvline(p.start_s, color="0.3", linewidth=0.8)
        for join in summary.joins:
            if join.joined_at_s is not None:
                ax.axvline(join.joined_at_s, color="tab:red", linewidth=1, linestyle=":")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=7)
    for join in summary.joins:
        if join.joined_at_s is not None:
            top.annotate(
                f"{join.label} joins (limit {join.start_limit})",
                xy=(join.joined_at_s, 0.92),
                xycoords=("data", "axes fraction"),
                xytext=(4, 0),
                textcoords="offset points",
                fontsize=8,
                color="tab:red",
            )
    for p in summary.pool:
        _name_phase(top, p.name, p.start_s, p.end_s)
    return _save(fig, title, path)
