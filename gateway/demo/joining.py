"""``sweetspot demo --elastic``: the second simulator's join, set up and reported.

:func:`elastic_run` sizes the open-loop arrivals from the sweep and names the two simulators; the demo's
drive (:mod:`gateway.demo.run`) lists the second one in the gateway's ``upstreams_file`` as the join phase
starts (:func:`write_upstreams_file`: written whole, then renamed into place, so the gateway's check never
reads half a file); :func:`finish_elastic` prints the ending (:mod:`gateway.demo.elastic`) and writes
``demo.json`` and ``demo.png``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from gateway.demo.elastic import join_lines, pool_table, summarize_elastic, upstream_table
from gateway.demo.outcome import write_json
from gateway.demo.plot import plot_elastic
from gateway.demo.reference import backend_requests_per_s
from gateway.demo.script import Script, arrival_rate
from gateway.demo.timeline import Sample, upstream_state
from gateway.sweep.result import SweepResult


class ElasticError(RuntimeError):
    """The elastic variant cannot start (the sweep gave nothing to size its load by)."""


@dataclass(slots=True)
class ElasticRun:
    """What the elastic variant adds to the drive: the upstreams file, who joins when, and how to name them."""

    file: Path
    listed: list[str]  # the URLs the file lists now
    joiners: dict[int, tuple[str, str]]  # phase index -> (label, url) of the upstream that joins as it starts
    labels: dict[str, str]  # url -> label, for every upstream the demo started
    model: str  # the capacity signal's model label: the one the simulators serve
    arrivals: list[float]  # each phase's arrivals per second
    written_at: dict[int, float] = field(default_factory=dict)  # phase index -> when the file listed its joiner


def write_upstreams_file(path: Path, urls: list[str]) -> None:
    """The gateway's ``upstreams_file``, written whole and renamed into place so a check never reads half of it."""
    text = "# written by `sweetspot demo --elastic`: the gateway re-reads it every discovery_interval_s\n"
    text += "".join(f"{url}\n" for url in urls)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def decision_log(upstream: Any) -> list[Any] | None:
    """An upstream entry's controller decision log, when ``/state`` has one."""
    controller = upstream.get("controller") if isinstance(upstream, dict) else None
    decisions = controller.get("decisions") if isinstance(controller, dict) else None
    return decisions if isinstance(decisions, list) else None


def join_phase(script: Script) -> int:
    return next(index for index, phase in enumerate(script.phases) if phase.join)


def elastic_run(script: Script, result: SweepResult, path: Path, first: str, second: str) -> ElasticRun:
    rate = backend_requests_per_s(result)
    if rate is None:
        raise ElasticError("the sweep kept no level at its sweet spot: no requests/s to size the elastic load by")
    return ElasticRun(
        file=path,
        listed=[first],
        joiners={join_phase(script): ("backend-2", second)},
        labels={first: "backend-1", second: "backend-2"},
        model=result.server.model,
        arrivals=[arrival_rate(phase, rate) for phase in script.phases],
    )


def finish_elastic(
    console: Console,
    script: Script,
    samples: list[Sample],
    final: Any,
    elastic: ElasticRun,
    meta: dict[str, Any],
    files: dict[str, Path],
    title: str,
) -> None:
    """The elastic ending: the pool and each upstream per phase, the join, and the same files."""
    summary = summarize_elastic(script.phases, samples, elastic.arrivals, elastic.joiners, elastic.written_at)
    console.print(pool_table(summary))
    console.print(upstream_table(summary))
    interval = meta["gateway_env"].get("SWEETSPOT_DISCOVERY_INTERVAL_S")
    for line in join_lines(summary, elastic.file.name, float(interval) if interval else None):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    upstreams = final.get("upstreams") if isinstance(final, dict) else None
    decisions = {
        elastic.labels.get(str(entry.get("url")), str(entry.get("url"))): decision_log(entry)
        for entry in (upstreams if isinstance(upstreams, list) else [])
        if isinstance(entry, dict)
    }
    meta["elastic"] = {
        "upstreams_file": str(elastic.file),
        "labels": elastic.labels,
        "arrivals_per_s": [round(rate, 3) for rate in elastic.arrivals],
        **summary.as_dict(),
        "controller_decisions": decisions,
    }
    write_json(
        files["summary+timeline"],
        meta=meta,
        summaries=[],
        passed=None,
        samples=samples,
        decisions=decision_log(upstream_state(final)),
    )
    plot_elastic(samples, summary, files["plot"], title=title)
