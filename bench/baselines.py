"""The controller side by side with the limit schemes users run today, on every scenario (issue 19).

Each scenario of ``testbed/scenarios/catalogue.py`` runs once per scheme in the same harness, with the same
seed, and every phase is judged against the same oracle (the best static limit, simulated under that
phase's conditions). The schemes live in ``gateway/control/baselines`` (one per module, each from its
reference, published defaults): static at the sweet spot a sweep measured before the run, static at the
backend's ``--max-num-seqs`` (no gateway limit), the Gateway API Inference Extension's threshold gate,
Envoy's gradient controller, Netflix's Gradient2, Vegas and AIMD on latency.

    python -m bench.baselines                              # every scenario, a table
    python -m bench.baselines --quick                      # the five shifting scenarios only
    python -m bench.baselines --docs docs/controller.md --plot docs/baselines   # what the docs show

    python -m bench.baselines --matrix --jobs 2 --docs docs/controller.md --plot docs/baselines \\
        --json docs/baselines-matrix.json        # every deployment x 4 scenarios (issue 38)
    python -m bench.baselines --matrix --quick --schemes controller,static_16   # smoke: two small deployments
    python -m bench.baselines --matrix --jobs 2 --schemes controller --seed 2   # the controller's cells, another draw
    python -m bench.baselines --matrix --jobs 2 --schemes controller,static_switched --seed 2   # and the reference's

The matrix's ``static_switched`` column is a reference, not an alternative (:class:`PhaseSchedule`): the best
static limit of each phase, switched at the phase's start, run in the scenario itself.

Run from the repository root (``tests`` is a package there). ``--docs`` rewrites the section between
``<!-- baselines:begin -->`` and ``<!-- baselines:end -->``; ``--plot`` writes one PNG per scenario with
every scheme's limit over time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from bench._json import write_json
from gateway.control.algorithm import Decision, LimitAlgorithm
from gateway.control.baselines import (
    AimdLatencyLimit,
    EnvoyGradient,
    Gradient2Limit,
    ThresholdGate,
    VegasLimit,
)
from gateway.control.baselines.common import decision
from gateway.control.baselines.envoy_gradient import CONCURRENCY_UPDATE_INTERVAL_S
from gateway.control.baselines.threshold import REFRESH_METRICS_INTERVAL_S
from gateway.control.config import AimdConfig
from gateway.control.observation import Observation
from gateway.sim.profiles import get_profile
from testbed.scenarios.catalogue import (
    SCENARIOS,
    Phase,
    PhaseResult,
    Scenario,
    by_name,
    phase_oracle,
    run,
    sweep_start,
)
from testbed.scenarios.harness import Conditions, Workload

BEGIN, END = "<!-- baselines:begin -->", "<!-- baselines:end -->"
CONTROLLER = "controller"
# The schemes item 3's goal compares the controller with: the latency-based adaptive ones and the threshold.
ADAPTIVE = ("threshold", "envoy_gradient", "gradient2", "vegas", "aimd_latency")
SHIFTING = ("load_steps", "backend_slowdown", "output_mix_shift", "tight_kv", "error_storm")
GOAL_RATIO = 1.5
GOAL_WINS = 3
GOAL_FLOOR = 0.95


@dataclass(frozen=True, slots=True)
class Scheme:
    """One contender: how to build it for a scenario, and the pace its reference runs at."""

    name: str
    label: str
    build: Callable[[Scenario, AimdConfig], dict[str, Any]]  # keyword arguments for scenarios.run


def _static_sweet_spot(scenario: Scenario, config: AimdConfig) -> dict[str, Any]:
    """The sweet spot ``sweetspot sweep`` reports for the scenario's first conditions (or its own sweep),
    measured before the run as an operator would: through one gateway, then split evenly when several
    gateways share the backend."""
    conditions = scenario.sweep or scenario.phases[0].conditions
    gateways = len(conditions.clients)
    backend = replace(conditions, clients=(sum(conditions.clients),))  # the sweep measures the backend alone
    spot = sweep_start(scenario.profile, backend, config, scenario.seed, scenario.sweep_levels).limit
    return {"static_limit": max(1, -(-spot // gateways))}


def _per_request(factory: Callable[[], LimitAlgorithm]) -> Callable[[Scenario, AimdConfig], dict[str, Any]]:
    return lambda scenario, config: {"algorithm": factory}


SCHEMES: tuple[Scheme, ...] = (
    Scheme(CONTROLLER, "sweetspot controller", lambda scenario, config: {}),
    Scheme("static_sweep", "static at the sweep's sweet spot", _static_sweet_spot),
    Scheme(
        "static_max",
        "static at --max-num-seqs",
        lambda scenario, config: {"static_limit": get_profile(scenario.profile).max_num_seqs},
    ),
    Scheme(
        "threshold",
        "threshold (GIE: waiting < 5, KV < 0.8)",
        lambda scenario, config: {
            "algorithm": ThresholdGate,
            "control_interval_s": REFRESH_METRICS_INTERVAL_S,
            "scrape_interval_s": REFRESH_METRICS_INTERVAL_S,
        },
    ),
    Scheme(
        "envoy_gradient",
        "Envoy gradient controller",
        lambda scenario, config: {"algorithm": EnvoyGradient, "control_interval_s": CONCURRENCY_UPDATE_INTERVAL_S},
    ),
    Scheme("gradient2", "Netflix Gradient2", _per_request(Gradient2Limit)),
    Scheme("vegas", "Netflix Vegas", _per_request(VegasLimit)),
    Scheme("aimd_latency", "Netflix AIMD (latency)", _per_request(AimdLatencyLimit)),
)

# Other settings an operator might choose where a default looks made for RPCs, not LLM streams: AIMD's
# 5 s timeout (every chat answer exceeds it) and Envoy's minRTT interval (the docs' example 60 s). Shown
# beside the defaults (``--variants``) so the verdict cannot hinge on one number; the goal counts defaults.
VARIANTS: tuple[Scheme, ...] = (
    *(
        Scheme(
            f"aimd_latency_{timeout:.0f}s",
            f"Netflix AIMD (latency), timeout {timeout:.0f} s",
            _per_request(partial(AimdLatencyLimit, timeout_s=timeout)),
        )
        for timeout in (15.0, 30.0, 60.0)
    ),
    Scheme(
        "envoy_gradient_600s",
        "Envoy gradient controller, minRTT every 600 s",
        lambda scenario, config: {
            "algorithm": partial(EnvoyGradient, min_rtt_interval_s=600.0),
            "control_interval_s": CONCURRENCY_UPDATE_INTERVAL_S,
        },
    ),
)


@dataclass
class Run:
    """One scheme on one scenario: its phases, and the figures the table shows."""

    scheme: str
    scenario: str
    phases: list[PhaseResult]
    static_limit: int | None = None
    cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def judged(self) -> list[tuple[PhaseResult, float]]:
        """Each phase with the length of its judged interval (from 30 s into the phase, as the goodput)."""
        from testbed.scenarios.catalogue import CONVERGE_S

        return [(p, max(p.end - min(p.start + CONVERGE_S, p.end), 0.0)) for p in self.phases]

    @property
    def goodput(self) -> float:
        """Output tokens/s within the objectives over every phase's judged interval, time-weighted."""
        spans = self.judged()
        total = sum(span for _, span in spans)
        return sum(p.goodput * span for p, span in spans) / total if total else 0.0

    @property
    def best_static_ratio(self) -> float | None:
        """Goodput over the best static limit's, over the phases that have an oracle."""
        spans = [(p, span) for p, span in self.judged() if p.oracle is not None]
        best = sum(p.oracle.best.goodput * span for p, span in spans if p.oracle is not None)
        return sum(p.goodput * span for p, span in spans) / best if best else None

    def worst(self, value: Callable[[PhaseResult], float | None]) -> float | None:
        values = [v for v in (value(p) for p in self.phases) if v is not None]
        return max(values) if values else None

    @property
    def preemptions(self) -> int:
        return sum(p.preemptions for p in self.phases)

    def limits(self) -> list[tuple[float, int]]:
        """The limit over time, summed over gateways."""
        out: list[tuple[float, int]] = []
        for phase in self.phases:
            # The gateways tick at staggered offsets, so the last may have one tick fewer in a phase: the
            # sums pair the gateways' ticks round by round and drop an incomplete last round.
            out += [(ticks[0][0], sum(limit for _, limit in ticks)) for ticks in zip(*phase.limits, strict=False)]
        return out


def run_scheme(scheme: Scheme, scenario: Scenario, config: AimdConfig) -> Run:
    started = time.process_time()
    kwargs = scheme.build(scenario, config)
    phases = run(scenario, config, **kwargs)
    return Run(scheme.name, scenario.name, phases, kwargs.get("static_limit"), time.process_time() - started)


# --- the report ------------------------------------------------------------------------------------
HEADER = (
    "scenario",
    "scheme",
    "goodput / best static, per phase",
    "overall",
    "vs controller",
    "p99 TTFT (worst phase)",
    "p99 TPOT (worst phase)",
    "preemptions",
    "median limit, per phase",
    "converged after, per phase",
)


def _ms(value: float | None) -> str:
    return "-" if value is None else (f"{value:.1f} s" if value >= 10 else f"{value * 1000:.0f} ms")


def row(outcome: Run, controller: Run) -> tuple[str, ...]:
    ratios = " / ".join("-" if p.goodput_ratio is None else f"{p.goodput_ratio:.2f}" for p in outcome.phases)
    overall = outcome.best_static_ratio
    vs = "-" if outcome.scheme == CONTROLLER else _times(_ratio(controller.goodput, outcome.goodput))
    converged = " / ".join(
        "-" if p.oracle is None else ("never" if p.convergence_s is None else f"{p.convergence_s:.0f} s")
        for p in outcome.phases
    )
    label = label_of(outcome.scheme)
    if outcome.static_limit is not None:
        label += f" ({outcome.static_limit})"
    medians = " / ".join("-" if p.settled is None else f"{p.settled:g}" for p in outcome.phases)
    return (
        outcome.scenario,
        label,
        ratios,
        "-" if overall is None else f"{overall:.2f}",
        vs,
        _ms(outcome.worst(lambda p: p.ttft_p99)),
        _ms(outcome.worst(lambda p: p.tpot_p99)),
        str(outcome.preemptions),
        medians,
        converged,
    )


def label_of(name: str) -> str:
    return next(s.label for s in (*SCHEMES, *VARIANTS) if s.name == name)


def markdown(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The controller's goodput over each adaptive scheme's on one scenario (over all judged intervals)."""

    scenario: str
    controller: float
    ratios: dict[str, float]  # scheme -> controller goodput / scheme goodput

    @property
    def best(self) -> str:
        """The scheme the controller did least well against: the best of them here."""
        return min(self.ratios, key=lambda name: self.ratios[name])

    @property
    def ratio(self) -> float:
        return self.ratios[self.best]


def _ratio(mine: float, theirs: float) -> float:
    return mine / theirs if theirs > 0 else float("inf")


def _times(ratio: float) -> str:
    return "no goodput" if ratio == float("inf") else (">100x" if ratio > 100 else f"{ratio:.2f}x")


def verdicts(outcomes: dict[str, dict[str, Run]]) -> list[Verdict]:
    out = []
    for scenario, by_scheme in outcomes.items():
        schemes = [name for name in ADAPTIVE if name in by_scheme]
        if CONTROLLER not in by_scheme or not schemes:
            continue
        mine = by_scheme[CONTROLLER].goodput
        out.append(Verdict(scenario, mine, {name: _ratio(mine, by_scheme[name].goodput) for name in schemes}))
    return out


def goal_text(found: list[Verdict]) -> str:
    schemes = [name for name in ADAPTIVE if found and name in found[0].ratios]
    shifting = [v for v in found if v.scenario in SHIFTING]
    wins = [v for v in shifting if v.ratio >= GOAL_RATIO]
    below = [v for v in found if v.ratio < GOAL_FLOOR]
    header = (
        "scenario",
        "controller goodput",
        *(f"controller / {name}" for name in schemes),
        "best of them",
        "controller / best",
    )
    rows = [
        (
            v.scenario + (" (shifting)" if v.scenario in SHIFTING else ""),
            f"{v.controller:.0f} tok/s",
            *(_times(v.ratios[name]) for name in schemes),
            v.best,
            _times(v.ratio),
        )
        for v in found
    ]
    per_scheme = [f"{name} {sum(v.ratios[name] >= GOAL_RATIO for v in shifting)}/{len(shifting)}" for name in schemes]
    held = len(wins) >= GOAL_WINS and not below
    lines = [
        markdown(header, rows),
        f"Goal (issue 19, item 3): the controller's goodput >= {GOAL_RATIO}x the best of the latency-based adaptive "
        f"schemes and the threshold gate on at least {GOAL_WINS} of the {len(SHIFTING)} shifting scenarios, and "
        f">= {GOAL_FLOOR}x each of them on every scenario. Goodput here: output tokens/s of requests within both "
        "objectives over every phase's judged interval (from 30 s into it), phases without an oracle included.",
        "",
        f"- >= {GOAL_RATIO}x the best of them on {len(wins)} of {len(shifting)} shifting scenarios"
        + (f" ({', '.join(v.scenario for v in wins)})" if wins else "")
        + "; against each scheme alone, the "
        f"shifting scenarios where the controller gets >= {GOAL_RATIO}x: " + ", ".join(per_scheme) + ".",
        f"- below {GOAL_FLOOR}x of some scheme on {len(below)} scenario(s)"
        + (": " + ", ".join(f"{v.scenario} ({v.ratio:.2f}x {v.best})" for v in below) if below else "")
        + ".",
        f"- **The goal {'holds' if held else 'does not hold'}** in this run.",
    ]
    return "\n".join(lines) + "\n"


def update_docs(path: Path, body: str, begin: str = BEGIN, end: str = END) -> None:
    text = path.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise SystemExit(f"{path} has no {begin} ... {end} section to rewrite")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{body}\n{end}{tail}", encoding="utf-8")


def plot(outcomes: dict[str, Run], directory: Path, clients: int) -> Path:
    """One PNG: every scheme's limit over time on one scenario, over the oracle's band per phase. The axis
    stops a little above ``clients``: a limit beyond the number of clients admits nobody more."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    reference = outcomes[CONTROLLER] if CONTROLLER in outcomes else next(iter(outcomes.values()))
    fig, ax = plt.subplots(figsize=(11, 4.2))
    top = 0
    colours = {
        "threshold": "tab:red",
        "envoy_gradient": "tab:purple",
        "gradient2": "tab:brown",
        "vegas": "tab:pink",
        "aimd_latency": "tab:orange",
    }
    for name, outcome in outcomes.items():
        points = outcome.limits()
        label = label_of(name)
        if name == "static_max":
            ax.plot([], [], color="grey", ls=":", label=f"{label} ({outcome.static_limit}, above the chart)")
            continue
        style: dict[str, Any] = dict(color=colours.get(name, "tab:blue"), lw=1.0, alpha=0.85)
        if name == CONTROLLER:
            style = dict(color="black", lw=2.0, zorder=5)
        if name.startswith("static"):
            style = dict(color="grey", lw=1.2, ls="--")
            label += f" ({outcome.static_limit}{' per gateway' if len(outcome.phases[0].limits) > 1 else ''})"
        ax.plot([t for t, _ in points], [limit for _, limit in points], label=label, drawstyle="steps-post", **style)
        top = max(top, max((limit for _, limit in points), default=0))
    clipped = top > 1.25 * clients
    top = min(top, int(1.25 * clients))
    for phase in reference.phases:
        if phase.oracle is not None:
            ax.fill_between([phase.start, phase.end], *phase.band, color="tab:green", alpha=0.12, lw=0)
        ax.axvline(phase.start, color="grey", lw=0.5)
        ax.text(phase.start + 2, top * 1.08, phase.phase, fontsize=8, va="top")
    ax.set(
        title=f"{reference.scenario}: concurrency limit by scheme (green: oracle sweet spot +-20%)",
        xlabel="simulated seconds",
        ylabel="concurrency limit (all gateways)" + (f"\nclipped above {top}" if clipped else ""),
    )
    ax.set_ylim(0, top * 1.12 + 1)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    path = directory / f"{reference.scenario}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


# --- the matrix: every deployment x four scenarios (issue 38) ----------------------------------------
MATRIX_BEGIN, MATRIX_END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
GUESSES = (16, 32, 64, 128)  # static limits an operator might guess


def _static(limit: int) -> Callable[[Scenario, AimdConfig], dict[str, Any]]:
    return lambda scenario, config: {"static_limit": limit}


GUESS_SCHEMES: tuple[Scheme, ...] = tuple(Scheme(f"static_{n}", f"static {n} (a guess)", _static(n)) for n in GUESSES)


class PhaseSchedule:
    """Each phase's own limit from that phase's start: a schedule of ``(start, limit)`` in the harness's time.

    With the oracle's best static limit per phase, this is what an operator who knew every change in advance
    would configure, switched at the first tick of each phase (at most one control interval late). The oracle
    measures each limit in a steady state after a long warm-up; run in the scenario itself, the same limits
    pay for its transitions (a start of every client at once, requests admitted before a slowdown still
    running after it). So this scheme's cell is how much of the oracle's goodput any limit could reach there:
    the reference a miss of goal 1 is read against, never an alternative the goals count."""

    def __init__(self, schedule: Sequence[tuple[float, int]]) -> None:
        self._schedule = tuple(sorted(schedule))
        if not self._schedule or self._schedule[0][0] > 0 or any(limit < 1 for _, limit in self._schedule):
            raise ValueError("a schedule needs a limit of at least 1 from time 0 on")
        self._limit = self._schedule[0][1]

    @property
    def limit(self) -> int:
        return self._limit

    def step(self, observation: Observation) -> Decision:
        previous = self._limit
        self._limit = next(limit for start, limit in reversed(self._schedule) if observation.now >= start)
        return decision(observation.now, self._limit, previous, "schedule")

    def state(self) -> dict[str, Any]:
        return {"algorithm": "schedule", "limit": self._limit, "schedule": [list(item) for item in self._schedule]}


def _best_static_switched(scenario: Scenario, config: AimdConfig) -> dict[str, Any]:
    """The oracle's best static limit of every phase, held from the phase's start (split evenly over the
    gateways); a phase with no oracle keeps the limit before it."""
    gateways = len(scenario.phases[0].conditions.clients)
    schedule: list[tuple[float, int]] = []
    start = 0.0
    for phase in scenario.phases:
        if phase.judged_against_static:
            best = phase_oracle(scenario, phase, config).best.limit
            schedule.append((start, max(1, -(-best // gateways))))
        start += phase.duration_s
    if not schedule:
        raise ValueError(f"{scenario.name} has no phase judged against the best static limits")
    schedule[0] = (0.0, schedule[0][1])
    return {"algorithm": partial(PhaseSchedule, schedule)}


# The reference column: not an alternative a user runs, so no goal counts it (PhaseSchedule says why).
SWITCHED = "static_switched"
REFERENCE_SCHEMES: tuple[Scheme, ...] = (
    Scheme(SWITCHED, "best static per phase, switched at its start (reference)", _best_static_switched),
)
MATRIX_SCHEMES = (CONTROLLER, SWITCHED, "static_max", *ADAPTIVE, *(s.name for s in GUESS_SCHEMES))
MATRIX_KINDS = ("steady_overload", "load_steps", "backend_slowdown", "output_mix_shift")
GOAL_CELL = 0.9  # the controller's goodput over the best static limit's, in every cell
GOAL_FAIL = 0.7  # every alternative falls below this in at least one deployment
GOAL_WORST = 1.5  # the controller's worst cell over the best alternative's worst cell


@dataclass(frozen=True, slots=True)
class Deployment:
    """One model on one GPU under one kind of traffic: a profile, its workload and the load that overloads it.

    ``overload`` is about twice what the backend holds at once (its KV cache or its ``--max-num-seqs``), so
    every phase but the low one has a queue; ``low`` is 15% of it (the catalogue's 12 of 80). ``phase_scale``
    stretches the catalogue's phase lengths where one answer takes minutes. ``ttft_slo_s`` replaces the
    default TTFT objective (2 s) where no concurrency can meet it, for the controller and the judge alike."""

    name: str
    description: str
    profile: str
    workload: Workload
    overload: int
    phase_scale: float = 1.0
    ttft_slo_s: float | None = None

    @property
    def low(self) -> int:
        return max(1, round(0.15 * self.overload))

    def config(self) -> AimdConfig:
        return AimdConfig() if self.ttft_slo_s is None else AimdConfig(ttft_p99_slo_s=self.ttft_slo_s)

    def answers(self, factor: float) -> Workload:
        lo, hi = self.workload.output
        return replace(self.workload, output=(max(1, round(lo * factor)), max(1, round(hi * factor))))

    def scenarios(self, scale: float = 1.0) -> list[Scenario]:
        """The catalogue's steady overload, load steps, 2x slowdown and 5x longer answers, on this deployment."""
        k = self.phase_scale * scale
        high = Conditions((self.overload,), self.workload)
        low = Conditions((self.low,), self.workload)
        slow = Conditions((self.overload,), self.workload, speed_factor=2.0)
        phases = {
            "steady_overload": (Phase("overload", 240 * k, high),),
            "load_steps": (
                Phase("high", 150 * k, high),
                Phase("low", 90 * k, low, ("no_drift", "goodput")),
                Phase("high again", 150 * k, high),
            ),
            "backend_slowdown": (
                Phase("normal", 150 * k, high),
                Phase("2x slower", 150 * k, slow),
                Phase("recovered", 150 * k, high),
            ),
            "output_mix_shift": (
                Phase("short answers", 150 * k, Conditions((self.overload,), self.answers(0.4))),
                Phase("long answers", 180 * k, Conditions((self.overload,), self.answers(2.0))),
            ),
        }
        return [Scenario(f"{self.name}.{kind}", self.description, self.profile, phases[kind]) for kind in MATRIX_KINDS]


DEPLOYMENTS: tuple[Deployment, ...] = (
    Deployment(
        "8b-h100-chat",
        "Llama-3.1-8B FP8 on one H100 80 GB, chat",
        "llama3.1-8b-fp8-h100",
        Workload(prompt=(256, 768), output=(256, 768)),
        overload=400,
    ),
    Deployment(
        "70b-tp2-long-prompts",
        "Llama-3.3-70B FP8 on two H100 80 GB (TP 2), 4-6K-token prompts",
        "llama3.3-70b-fp8-2xh100",
        Workload(prompt=(4000, 6000), output=(300, 700)),
        overload=160,
    ),
    Deployment(
        "70b-tp2-reasoning",
        "Llama-3.3-70B FP8 on two H100 80 GB (TP 2), reasoning: 1.5-4.5K-token answers",
        "llama3.3-70b-fp8-2xh100",
        Workload(prompt=(256, 768), output=(1500, 4500)),
        overload=240,
        phase_scale=2.0,
    ),
    Deployment(
        "8b-awq-16gb-chat",
        "Llama-3-8B AWQ on a 16 GB RTX 4060 Ti, chat",
        "llama3-8b-awq-16gb",
        Workload(prompt=(256, 768), output=(256, 768)),
        overload=80,
    ),
    Deployment(
        "moe-32gb-chat",
        "Qwen3.6-35B-A3B 4-bit on a 32 GB RTX 5090, chat (the article's)",
        "qwen3.6-35b-a3b-32gb",
        Workload(prompt=(256, 768), output=(256, 768)),
        overload=80,
    ),
    Deployment(
        "rag-32k-24gb",
        "Mistral-7B on a 24 GB RTX 4090, RAG over 24-31K-token contexts",
        "mistral-7b-rag-24gb",
        Workload(prompt=(24000, 31000), output=(128, 512)),
        overload=12,
        ttft_slo_s=10.0,
    ),
)
QUICK_DEPLOYMENTS = ("rag-32k-24gb", "8b-awq-16gb-chat")


def deployment(name: str) -> Deployment:
    for d in DEPLOYMENTS:
        if d.name == name:
            return d
    raise KeyError(f"unknown deployment {name!r}; known: {', '.join(d.name for d in DEPLOYMENTS)}")


def _scheme(name: str) -> Scheme:
    return next(s for s in (*SCHEMES, *VARIANTS, *GUESS_SCHEMES, *REFERENCE_SCHEMES) if s.name == name)


def run_deployment(
    name: str, schemes: tuple[str, ...], scale: float, seed: int | None = None
) -> dict[str, dict[str, Run]]:
    """Every scenario of one deployment with every scheme (one process: the oracles are shared). ``seed``: in
    place of the catalogue's, for the clients' draws and the oracle alike."""
    d = deployment(name)
    config = d.config()
    out: dict[str, dict[str, Run]] = {}
    for scenario in d.scenarios(scale):
        if seed is not None:
            scenario = replace(scenario, seed=seed)
        out[scenario.name] = {}
        for scheme in schemes:
            outcome = run_scheme(_scheme(scheme), scenario, config)
            out[scenario.name][scheme] = outcome
            print(
                f"{scenario.name:36} {scheme:16} goodput {outcome.goodput:8.0f} tok/s  "
                f"best-static ratio {outcome.best_static_ratio or 0:.3f}  ({outcome.cpu_s:.1f} s CPU)",
                flush=True,
            )
    return out


def matrix_label(name: str) -> str:
    return _scheme(name).label


def matrix_table(outcomes: dict[str, dict[str, Run]], schemes: Sequence[str]) -> str:
    """One row per cell (deployment x scenario), one column per scheme: goodput over the best static limit's."""
    header = ("deployment", "scenario", "best static, per phase", *(matrix_label(s) for s in schemes))
    rows = []
    for scenario, by_scheme in outcomes.items():
        dep, kind = scenario.split(".", 1)
        reference = next(iter(by_scheme.values()))
        best = " / ".join("-" if p.oracle is None else str(p.oracle.best.limit) for p in reference.phases)
        cells = []
        for name in schemes:
            ratio = by_scheme[name].best_static_ratio if name in by_scheme else None
            cells.append("-" if ratio is None else f"{ratio:.2f}")
        rows.append((dep, kind, best, *cells))
    return markdown(header, rows)


def matrix_goals(outcomes: dict[str, dict[str, Run]], schemes: Sequence[str]) -> str:
    """Issue 38's three goals, computed from the cells; nothing here is tuned to them."""

    def ratio(run_: Run) -> float:
        return run_.best_static_ratio or 0.0

    cells = {name: [(sc, ratio(by[name])) for sc, by in outcomes.items() if name in by] for name in schemes}
    worst = {name: min(cells[name], key=lambda c: c[1]) for name in schemes if cells[name]}
    references = {s.name for s in REFERENCE_SCHEMES}
    others = [name for name in schemes if name != CONTROLLER and name not in references and name in worst]
    mine = cells.get(CONTROLLER, [])
    misses = [(sc, r) for sc, r in mine if r < GOAL_CELL]
    never = []
    for name in others:
        deployments_below = {sc.split(".")[0] for sc, r in cells[name] if r < GOAL_FAIL}
        if not deployments_below:
            never.append(name)
    best_other = max(others, key=lambda n: worst[n][1]) if others else None
    lines = [
        "| scheme | worst cell | its goodput / best static | cells below 0.7 |",
        "|---|---|---|---|",
    ]
    for name in schemes:
        if name in worst:
            sc, r = worst[name]
            below = sum(1 for _, v in cells[name] if v < GOAL_FAIL)
            lines.append(f"| {matrix_label(name)} | {sc} | {r:.2f} | {below}/{len(cells[name])} |")
    lines.append("")
    lines.append(
        f"- Goal 1, the controller at its defaults >= {GOAL_CELL}x the best static limit in every cell: "
        + (
            "**holds**."
            if mine and not misses
            else f"**missed** in {len(misses)} of {len(mine)} cells: "
            + ", ".join(f"{sc} ({r:.2f})" for sc, r in misses)
            + "."
        )
    )
    lines.append(
        f"- Goal 2, every alternative below {GOAL_FAIL}x in at least one deployment: "
        + ("**holds**." if not never else "**missed** by " + ", ".join(matrix_label(n) for n in never) + ".")
    )
    if mine and best_other is not None:
        mine_worst = worst[CONTROLLER][1]
        theirs = worst[best_other][1]
        times = _times(_ratio(mine_worst, theirs))
        held = mine_worst > 0 and (theirs <= 0 or mine_worst / theirs >= GOAL_WORST)
        lines.append(
            f"- Goal 3, the controller's worst cell >= {GOAL_WORST}x the best alternative's worst cell: the "
            f"controller's worst is {mine_worst:.2f} ({worst[CONTROLLER][0]}), the best worst among the others is "
            f"{matrix_label(best_other)}'s {theirs:.2f} ({worst[best_other][0]}): {times}, "
            + ("**holds**." if held else "**missed**.")
        )
    if mine and SWITCHED in cells:
        reachable = dict(cells[SWITCHED])
        out_of_reach = [sc for sc, r in reachable.items() if r < GOAL_CELL]
        against = [(sc, r / reachable[sc]) for sc, r in mine if reachable.get(sc, 0) > 0]
        short = [(sc, r) for sc, r in against if r < GOAL_CELL]
        lines.append(
            f"- Read against the reference (the best static limit of each phase, switched at its start): it reaches "
            f"{GOAL_CELL}x the oracle in {len(cells[SWITCHED]) - len(out_of_reach)} of {len(cells[SWITCHED])} cells"
            + (f" (not in {', '.join(out_of_reach)})" if out_of_reach else "")
            + f"; the controller is at >= {GOAL_CELL}x the reference in {len(against) - len(short)} of {len(against)}"
            + (": short in " + ", ".join(f"{sc} ({r:.2f})" for sc, r in short) if short else "")
            + "."
        )
    return "\n".join(lines) + "\n"


def plot_deployment(name: str, outcomes: dict[str, dict[str, Run]], directory: Path, clients: int) -> Path:
    """One PNG per deployment: a panel per scenario, every scheme's limit over time over the oracle's band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    scenarios = [sc for sc in outcomes if sc.split(".")[0] == name]
    fig, axes = plt.subplots(len(scenarios), 1, figsize=(11, 2.6 * len(scenarios)), squeeze=False)
    colours = {
        CONTROLLER: "black",
        "threshold": "tab:red",
        "envoy_gradient": "tab:purple",
        "gradient2": "tab:brown",
        "vegas": "tab:pink",
        "aimd_latency": "tab:orange",
    }
    top = int(1.25 * clients)
    for ax, sc in zip(axes[:, 0], scenarios, strict=True):
        by_scheme = outcomes[sc]
        reference = by_scheme.get(CONTROLLER) or next(iter(by_scheme.values()))
        for phase in reference.phases:
            if phase.oracle is not None:
                ax.fill_between([phase.start, phase.end], *phase.band, color="tab:green", alpha=0.15, lw=0)
            ax.axvline(phase.start, color="grey", lw=0.5)
            ax.text(phase.start + 2, top * 1.02, phase.phase, fontsize=7, va="top")
        for scheme, outcome in by_scheme.items():
            if scheme.startswith("static"):
                continue  # flat lines at known values: in the table
            points = outcome.limits()
            style: dict[str, Any] = dict(color=colours.get(scheme, "tab:blue"), lw=1.0, alpha=0.85)
            if scheme == CONTROLLER:
                style = dict(color="black", lw=2.0, zorder=5)
            ax.plot(
                [t for t, _ in points],
                [limit for _, limit in points],
                drawstyle="steps-post",
                label=matrix_label(scheme),
                **style,
            )
        ax.set_ylim(0, top * 1.05 + 1)
        ax.set_title(sc.split(".", 1)[1], fontsize=9)
        ax.set_ylabel("limit")
    axes[-1, 0].set_xlabel("simulated seconds")
    axes[0, 0].legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.suptitle(f"{name}: concurrency limit by scheme (green: oracle sweet spot +-20%)", fontsize=10)
    fig.tight_layout()
    path = directory / f"matrix_{name}.png"
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def matrix_main(args: argparse.Namespace) -> None:
    """``--matrix``: every deployment x four scenarios x every scheme, deployments in parallel processes."""
    from concurrent.futures import ProcessPoolExecutor

    names = args.scenarios or (list(QUICK_DEPLOYMENTS) if args.quick else [d.name for d in DEPLOYMENTS])
    for name in names:
        deployment(name)  # fail early on a typo
    schemes = tuple(args.schemes.split(",")) if args.schemes else MATRIX_SCHEMES
    if CONTROLLER not in schemes:
        schemes = (CONTROLLER, *schemes)
    scale = 0.25 if args.quick else 1.0
    started = time.time()
    outcomes: dict[str, dict[str, Run]] = {}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {name: pool.submit(run_deployment, name, schemes, scale, args.seed) for name in names}
        for name in names:
            outcomes.update(futures[name].result())
    table = matrix_table(outcomes, schemes)
    goals = matrix_goals(outcomes, schemes)
    print()
    print(table)
    print(goals)
    print(f"{time.time() - started:.0f} s of wall time with {args.jobs} job(s)")
    pictures: list[Path] = []
    if args.plot is not None:
        for name in names:
            d = deployment(name)
            pictures.append(plot_deployment(name, outcomes, args.plot, d.overload))
    if args.docs is not None:
        command = "python -m bench.baselines " + " ".join(sys.argv[1:])
        body = f"<!-- generated by: {command.strip()} -->\n\n{table}\n{goals}"
        if pictures:
            rel = Path(os.path.relpath(args.plot.resolve(), args.docs.resolve().parent)).as_posix()
            body += "\n" + "\n\n".join(f"![{p.stem}]({rel}/{p.name})" for p in pictures) + "\n"
        update_docs(args.docs, body, MATRIX_BEGIN, MATRIX_END)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "deployments": [
                {
                    "name": d.name,
                    "profile": d.profile,
                    "overload": d.overload,
                    "low": d.low,
                    "ttft_slo_s": d.config().ttft_p99_slo_s,
                    "tpot_slo_s": d.config().tpot_p99_slo_s,
                }
                for d in DEPLOYMENTS
                if d.name in names
            ],
            "cells": [
                {
                    "scenario": o.scenario,
                    "scheme": o.scheme,
                    "static_limit": o.static_limit,
                    "goodput": o.goodput,
                    "best_static_ratio": o.best_static_ratio,
                    "preemptions": o.preemptions,
                    "phases": [
                        {
                            "phase": p.phase,
                            "goodput": p.goodput,
                            "goodput_ratio": p.goodput_ratio,
                            "best_static": p.oracle.best.limit if p.oracle is not None else None,
                            "best_static_goodput": p.oracle.best.goodput if p.oracle is not None else None,
                            "sweet_spot": p.oracle.sweet_spot if p.oracle is not None else None,
                            "ttft_p99_s": p.ttft_p99,
                            "tpot_p99_s": p.tpot_p99,
                            "settled": p.settled,
                        }
                        for p in o.phases
                    ],
                }
                for by_scheme in outcomes.values()
                for o in by_scheme.values()
            ],
        }
        write_json(args.json, payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help="scenario names (default: all; --quick: the shifting ones)")
    parser.add_argument("--quick", action="store_true", help="only the five shifting scenarios of the goal")
    parser.add_argument("--schemes", default=None, help="comma-separated scheme names (default: all)")
    parser.add_argument(
        "--variants",
        action="store_true",
        help="also run AIMD with other timeouts and Envoy with a rarer minRTT window (not in the goal)",
    )
    parser.add_argument("--seed", type=int, default=None, help="run every scenario (every matrix cell) with this seed")
    parser.add_argument("--docs", type=Path, default=None, help="markdown file whose baselines section to rewrite")
    parser.add_argument("--plot", type=Path, default=None, help="write one PNG per scenario into this folder")
    parser.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument(
        "--matrix",
        action="store_true",
        help="every deployment (names as positional arguments) x steady overload, load steps, 2x slowdown and "
        "5x longer answers, against the best static limit per phase (issue 38); --quick: two small ones, "
        "phases a quarter as long",
    )
    parser.add_argument("--jobs", type=int, default=1, help="--matrix: deployments run in this many processes")
    args = parser.parse_args()
    if args.matrix:
        matrix_main(args)
        return

    names = args.scenarios or (list(SHIFTING) if args.quick else [s.name for s in SCENARIOS])
    scenarios = [by_name(name) for name in names]
    if args.seed is not None:
        scenarios = [replace(scenario, seed=args.seed) for scenario in scenarios]
    wanted = args.schemes.split(",") if args.schemes else [s.name for s in SCHEMES]
    if args.variants:
        wanted += [s.name for s in VARIANTS]
    schemes = [s for s in (*SCHEMES, *VARIANTS) if s.name in wanted]
    if CONTROLLER not in wanted:
        schemes.insert(0, SCHEMES[0])  # every ratio is against the controller
    config = AimdConfig()
    started = time.process_time()
    outcomes: dict[str, dict[str, Run]] = {}
    for scenario in scenarios:
        outcomes[scenario.name] = {}
        for scheme in schemes:
            outcome = run_scheme(scheme, scenario, config)
            outcomes[scenario.name][scheme.name] = outcome
            print(
                f"{scenario.name:24} {scheme.name:16} goodput {outcome.goodput:7.0f} tok/s  "
                f"best-static ratio {outcome.best_static_ratio or 0:.3f}  ({outcome.cpu_s:.1f} s CPU)",
                flush=True,
            )
    rows = [row(o, by_scheme[CONTROLLER]) for by_scheme in outcomes.values() for o in by_scheme.values()]
    table = markdown(HEADER, rows)
    found = verdicts(outcomes)
    goal = goal_text(found)
    print()
    print(table)
    print(goal)
    print(f"{time.process_time() - started:.0f} s of CPU")
    if args.plot is not None:
        main_schemes = {s.name for s in SCHEMES}
        for scenario in scenarios:
            clients = max(sum(phase.conditions.clients) for phase in scenario.phases)
            plot(
                {name: run for name, run in outcomes[scenario.name].items() if name in main_schemes}, args.plot, clients
            )
    if args.docs is not None:
        command = "python -m bench.baselines " + " ".join(sys.argv[1:])
        pictures = ""
        if args.plot is not None:
            rel = Path(os.path.relpath(args.plot.resolve(), args.docs.resolve().parent)).as_posix()
            shown = [name for name in outcomes if name in SHIFTING]
            linked = [name for name in outcomes if name not in SHIFTING]
            pictures = "\nEvery scheme's limit over time, one picture per scenario" + (
                " (the others: " + ", ".join(f"[{name}]({rel}/{name}.png)" for name in linked) + ")" if linked else ""
            )
            pictures += ":\n\n" + "\n\n".join(f"![{name}]({rel}/{name}.png)" for name in shown) + "\n"
        update_docs(args.docs, f"<!-- generated by: {command.strip()} -->\n\n{table}\n{goal}{pictures}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = [
            {
                "scenario": o.scenario,
                "scheme": o.scheme,
                "static_limit": o.static_limit,
                "goodput": o.goodput,
                "best_static_ratio": o.best_static_ratio,
                "preemptions": o.preemptions,
                "phases": [
                    {
                        "phase": p.phase,
                        "goodput": p.goodput,
                        "goodput_ratio": p.goodput_ratio,
                        "ttft_p99_s": p.ttft_p99,
                        "tpot_p99_s": p.tpot_p99,
                        "preemptions": p.preemptions,
                        "convergence_s": p.convergence_s,
                        "settled": p.settled,
                    }
                    for p in o.phases
                ],
            }
            for by_scheme in outcomes.values()
            for o in by_scheme.values()
        ]
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
