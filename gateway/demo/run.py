"""``sweetspot demo`` end to end: simulator, sweep, gateway at the sweet spot, changing load, summary.

1. Start the simulator (``--admin``, time-scaled) on a free loopback port.
2. Sweep it directly (a few short levels) and write the sweep's report: the measured sweet spot.
3. Start the gateway in front of it with ``--sweep-result``, so its controller starts at that sweet
   spot, and with its time constants scaled like the simulator (see :mod:`gateway.demo.script`).
4. Drive closed-loop clients through the gateway phase by phase, changing the backend's speed through
   the simulator's admin endpoint, sampling the gateway's ``/state`` and the simulator's engine state
   into a timeline and showing it live (:mod:`gateway.demo.drive`).
5. Summarise where the limit held per phase against the sweet spot, write ``demo.json`` and
   ``demo.png``, and say where every file is.

With ``--elastic`` (:data:`~gateway.demo.script.ELASTIC`), a second simulator starts beside the first and
the gateway is started with an ``upstreams_file`` listing only the first; the load is open loop, more than one
backend can take; as the join phase starts the demo lists the second simulator in the file (written whole,
then renamed into place), and the gateway takes it in at its next ``discovery_interval_s`` check. Each tick
also reads the capacity signal from the gateway's ``/metrics``; the ending is the pool and each upstream per
phase and the join (:mod:`~gateway.demo.joining`, :mod:`~gateway.demo.elastic`).

Every child process is stopped on the way out: normal end, error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from gateway.common.processes import LISTENING, ProcessError, RunningProcess, process_factory, sweetspot_module
from gateway.demo.drive import DemoError, drive
from gateway.demo.joining import (
    ElasticError,
    ElasticRun,
    decision_log,
    elastic_run,
    finish_elastic,
    join_phase,
    write_upstreams_file,
)
from gateway.demo.outcome import headline, summary_table, write_json
from gateway.demo.plot import plot_timeline
from gateway.demo.reference import Reference, reference_for
from gateway.demo.script import (
    DEFAULT,
    ELASTIC,
    QUICK,
    QUICK_ELASTIC,
    Script,
    default_workload,
    gateway_env,
    scaled_slo,
)
from gateway.demo.summary import overall, summarize
from gateway.demo.timeline import Sample, upstream_state
from gateway.demo.view import make_view
from gateway.settings import Settings
from gateway.sweep.driver import SweepConfig, SweepError, run_sweep
from gateway.sweep.progress import sweep_progress
from gateway.sweep.result import SweepResult
from gateway.sweep.tables import headline as sweep_headline
from gateway.sweep.tables import write_report
from gateway.sweep.workload import Workload

DEFAULT_PROFILE = "qwen3.6-35b-a3b-32gb"


@dataclass(frozen=True, slots=True)
class DemoOptions:
    out: Path
    time_scale: float = 2.0
    duration_scale: float = 1.0
    quick: bool = False
    profile: str = DEFAULT_PROFILE
    seed: int = 0
    plain: bool = False  # plain lines even on a terminal
    print_every_s: float = 5.0  # plain view: one line this often
    sample_every_s: float = 0.5
    levels: tuple[int, ...] | None = None  # override the script's sweep levels
    strict: bool = False  # exit 1 when a judged phase misses the criterion
    elastic: bool = False  # the elastic script: a second simulator joins part way through

    def script(self) -> Script:
        variants = {(False, False): DEFAULT, (True, False): QUICK, (False, True): ELASTIC, (True, True): QUICK_ELASTIC}
        base = variants[(self.quick, self.elastic)]
        if self.levels:
            base = Script(base.phases, tuple(sorted(set(self.levels))), base.sweep_measure_s)
        return base.scaled(self.duration_scale) if self.duration_scale != 1.0 else base


@dataclass(slots=True)
class DemoOutcome:
    out: Path
    exit_code: int
    passed: bool | None = None
    interrupted: bool = False
    files: dict[str, Path] = field(default_factory=dict)


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Treat SIGTERM (CI cancelling a job, ``kill``) like Ctrl-C, so the same cleanup runs."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sweep(
    console: Console, sim_url: str, script: Script, workload: Workload, time_scale: float, out: Path
) -> SweepResult:
    # The sweep judges the sweet spot by the controller's own criterion (the smallest concurrency reaching
    # knee_fraction of the peak), so the two numbers the summary compares mean the same thing.
    config = SweepConfig(
        url=sim_url,
        levels=script.sweep_levels,
        duration_s=script.sweep_measure_s,
        workload=workload,
        slo=scaled_slo(time_scale),
        request_timeout_s=120.0,
        level_timeout_s=120.0,
        fraction=Settings().knee_fraction,
    )
    try:
        with sweep_progress(console) as progress:
            result = asyncio.run(run_sweep(config, progress))
    except SweepError as exc:
        raise DemoError(f"the sweep of the simulator failed: {exc}") from exc
    write_report(result, out)
    for line in sweep_headline(result):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    if result.sweet_spot is None:
        raise DemoError(
            f"the sweep found no sweet spot to start the controller at ({result.verdict}); see {out / 'sweep.md'}"
        )
    return result


def _print_files(console: Console, files: dict[str, Path]) -> None:
    console.print("files:", highlight=False)
    for label, path in files.items():
        if path.exists():
            console.print(f"  {label:<14} {path}", highlight=False, soft_wrap=True, markup=False)


def _sim_command(options: DemoOptions, seed: int) -> list[str]:
    return sweetspot_module(
        "sim",
        "--port",
        "0",
        "--profile",
        options.profile,
        "--time-scale",
        f"{options.time_scale:g}",
        "--admin",
        "--seed",
        str(seed),
    )


def run_demo(options: DemoOptions, console: Console) -> DemoOutcome:
    """Run the whole demo; never leaves a child process behind."""
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    script = options.script()
    workload: Workload = default_workload(options.seed)
    env = gateway_env(options.time_scale, elastic=script.elastic)
    outcome = DemoOutcome(out=out, exit_code=0)
    files = outcome.files
    files.update(
        {
            "summary+timeline": out / "demo.json",
            "plot": out / "demo.png",
            "sweep": out / "sweep" / "sweep.json",
            "sweep table": out / "sweep" / "sweep.md",
            "sweep plot": out / "sweep" / "sweep.png",
            "simulator log": out / "sim.log",
            "gateway log": out / "gateway.log",
        }
    )
    if script.elastic:
        files.update({"upstreams file": out / "upstreams.txt", "simulator 2 log": out / "sim-2.log"})
    samples: list[Sample] = []
    final: Any = None
    elastic: ElasticRun | None = None
    result: SweepResult | None = None
    references: list[Reference] = []
    pids: dict[str, int] = {}
    started = time.perf_counter()
    joining = f", a second simulator joining in phase {join_phase(script) + 1}" if script.elastic else ""
    console.print(
        f"sweetspot demo: simulator ({options.profile}) at {options.time_scale:g}x real time; sweep, then "
        f"{len(script.phases)} load phases ({script.load_s:.0f} s) through the gateway{joining}; files in {out}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"the gateway's time constants and SLOs are scaled by the same {options.time_scale:g}x: "
        + ", ".join(f"{k}={v}" for k, v in env.items()),
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    with _sigterm_interrupts():
        try:
            with process_factory() as start:

                def start_sim(seed: int, log: str) -> RunningProcess:
                    return start(
                        _sim_command(options, seed),
                        ready_pattern=LISTENING,
                        ready_url="{url}/health",
                        timeout=60,
                        log_path=out / log,
                        die_with_parent=True,
                    )

                sim = start_sim(options.seed, "sim.log")
                pids["sim"] = sim.pid
                console.print(f"simulator listening on {sim.url}", highlight=False)
                result = _sweep(console, sim.url, script, workload, options.time_scale, out / "sweep")
                references = [reference_for(result, p.speed_factor) for p in script.phases]
                gateway_env_now = dict(env)
                if script.elastic:
                    # Up before the load starts, like a new server that has loaded its model: what the join
                    # phase does is list it, not start it.
                    sim2 = start_sim(options.seed + 1, "sim-2.log")
                    pids["sim-2"] = sim2.pid
                    elastic = elastic_run(script, result, files["upstreams file"], sim.url, sim2.url)
                    write_upstreams_file(elastic.file, elastic.listed)
                    gateway_env_now["SWEETSPOT_UPSTREAMS_FILE"] = str(elastic.file)
                    console.print(
                        f"second simulator listening on {sim2.url}, not listed yet in {elastic.file}", highlight=False
                    )
                gateway = start(
                    sweetspot_module(
                        "serve",
                        "--upstream",
                        sim.url,
                        "--port",
                        "0",
                        "--sweep-result",
                        str(out / "sweep" / "sweep.json"),
                        "--log-level",
                        "info",
                    ),
                    env=gateway_env_now,
                    ready_pattern=LISTENING,
                    ready_url="{url}/readyz",
                    timeout=60,
                    log_path=out / "gateway.log",
                    die_with_parent=True,
                )
                pids["gateway"] = gateway.pid
                console.print(f"gateway listening on {gateway.url}, in front of {sim.url}", highlight=False)
                view = make_view(console, script.phases, plain=options.plain, every_s=options.print_every_s)
                with view:
                    final = asyncio.run(
                        drive(
                            gateway.url,
                            sim.url,
                            result.server.model,
                            script,
                            workload,
                            references,
                            view,
                            samples,
                            options.sample_every_s,
                            elastic,
                            options.seed,
                        )
                    )
        except KeyboardInterrupt:
            outcome.interrupted, outcome.exit_code = True, 130
            console.print("interrupted: every process the demo started has been stopped", highlight=False)
        except (DemoError, ElasticError, ProcessError) as exc:
            outcome.exit_code = 1
            console.print(f"error: {exc}", highlight=False, soft_wrap=True, markup=False)
    if result is not None and samples:
        _finish(
            console,
            options,
            script,
            result,
            references,
            samples,
            final,
            env,
            pids,
            outcome,
            time.perf_counter() - started,
            elastic,
        )
    _print_files(console, files)
    return outcome


def _finish(
    console: Console,
    options: DemoOptions,
    script: Script,
    result: SweepResult,
    references: list[Reference],
    samples: list[Sample],
    final: Any,
    env: dict[str, str],
    pids: dict[str, int],
    outcome: DemoOutcome,
    elapsed_s: float,
    elastic: ElasticRun | None = None,
) -> None:
    spot = result.sweet_spot
    controller_seen = any(s.action is not None for s in samples)
    meta: dict[str, Any] = {
        "created_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "interrupted": outcome.interrupted,
        "elapsed_s": round(elapsed_s, 1),
        "options": {
            "time_scale": options.time_scale,
            "duration_scale": options.duration_scale,
            "quick": options.quick,
            "profile": options.profile,
            "seed": options.seed,
        },
        "workload": default_workload(options.seed).describe(),
        "gateway_env": env,
        "pids": pids,
        "controller_seen": controller_seen,
        "sweep": {
            "sweet_spot": spot.concurrency if spot else None,
            "peak_tokens_per_s": result.peak_tokens_per_s,
            "peak_concurrency": result.peak_concurrency,
            "verdict": result.verdict,
            "levels": list(script.sweep_levels),
            "measure_s": script.sweep_measure_s,
            "file": str(outcome.files["sweep"]),
        },
        "script": [
            {"name": p.name, "clients": p.clients, "duration_s": p.duration_s, "speed_factor": p.speed_factor}
            | ({"rate_x": p.rate_x, "join": p.join} if script.elastic else {})
            for p in script.phases
        ],
    }
    title = (
        f"sweetspot demo: {options.profile} at {options.time_scale:g}x, sweep sweet spot "
        f"{spot.concurrency if spot else '-'}" + (" (interrupted)" if outcome.interrupted else "")
    )
    if elastic is not None:
        finish_elastic(console, script, samples, final, elastic, meta, outcome.files, title)
        return
    summaries = summarize(script.phases, samples, references)
    passed = overall(summaries)
    outcome.passed = passed
    console.print(summary_table(summaries, width=console.width))
    for line in headline(summaries, passed, controller_seen):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    write_json(
        outcome.files["summary+timeline"],
        meta=meta,
        summaries=summaries,
        passed=passed,
        samples=samples,
        decisions=decision_log(upstream_state(final)),
    )
    plot_timeline(samples, script.phases, summaries, outcome.files["plot"], title=title)
    if options.strict and passed is False and outcome.exit_code == 0:
        outcome.exit_code = 1


def default_out_dir() -> Path:
    return Path("out") / f"demo-{datetime.now():%Y%m%d-%H%M%S}"
