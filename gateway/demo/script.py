"""What the demo does, as data: the load phases, the sweep before them, and the clock they all share.

**Time scale.** The simulator runs its engine ``time_scale`` times faster than real time, so two wall
minutes show several minutes of a real server. Everything else that is measured in seconds is scaled by
the same factor, so the demo behaves like the real-time system, only faster: the latency objectives of
the sweep and of the controller (p99 TTFT 2 s, p99 TPOT 100 ms at real time) and the controller's
periods (tick, window, settle, measure, re-probe). The gateway gets those through ``SWEETSPOT_*``
environment variables; :func:`gateway_env` lists them and the demo prints them.

**Phases.** Closed-loop clients through the gateway, in the order a newcomer can follow: a light load
the limit does not bind (the controller must hold), a surge well over the sweet spot (the queue takes
the excess and the limit should stay near the sweet spot), the backend turning twice as slow for a
while (each engine step takes twice as long) and recovering, then a calmer load. A phase is *judged*
only when its clients exceed the sweet spot clearly (``DEMAND_MARGIN``): below that the limit is not
the bottleneck and where it sits proves nothing.

**Elastic** (``--elastic``). Open-loop clients instead: Poisson arrivals at a multiple of what one backend
delivers (the sweep's best requests/s within the objectives), more than one backend can take, so the queue
grows and the capacity signal (``sweetspot_upstreams_desired``) asks for a second backend. Then a second
simulator joins the running gateway through its ``upstreams_file`` (the demo writes the file; the gateway
checks it every ``discovery_interval_s``), starts at its sibling's limit, and the queue drains. Open loop
because the signal's demand is arrivals: closed-loop clients send as fast as they are served, so their
arrivals follow the capacity instead of exceeding it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.sweep.result import SLO
from gateway.sweep.workload import LengthDist, Workload

DEMAND_MARGIN = 1.25  # judged when clients >= this x the phase's reference sweet spot
TOLERANCE = 0.25  # the controller's median limit must be within +-25% of the reference
STEADY_SKIP = 0.3  # the first 30% of a phase is the transition; the rest is judged

REAL_TIME_SLO = SLO(ttft_ms=2000.0, tpot_ms=100.0)  # `sweetspot sweep`'s and the gateway's defaults

# The gateway's time constants (seconds) that the demo scales with the simulator, when the settings
# have them. Their defaults are read from gateway.settings, so the demo follows any change there.
SCALED_SETTINGS = (
    "control_interval_s",
    "window_s",
    "settle_s",
    "measure_s",
    "reprobe_s",
    "backend_queue_persist_s",
    "metrics_interval_s",
    "metrics_stale_s",
    "health_interval_s",
    "ttft_p99_slo_s",
    "tpot_p99_slo_s",
)
# Scaled as well in the elastic variant, which is the only one that has an upstreams file and whose phases
# are long enough for the capacity signal.
ELASTIC_SCALED_SETTINGS = ("discovery_interval_s", "scale_down_after_s")


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    clients: int
    duration_s: float
    speed_factor: float = 1.0  # the simulator's step time multiplier during this phase
    story: str = ""  # one line for the live view: what to watch for
    # > 0: open loop, Poisson arrivals at rate_x times one backend's requests/s (the sweep's best within the
    # objectives), and ``clients`` is not used; 0: ``clients`` closed-loop clients
    rate_x: float = 0.0
    join: bool = False  # a further simulator upstream joins the gateway as this phase starts


def arrival_rate(phase: Phase, backend_requests_per_s: float) -> float:
    """An open-loop phase's arrivals per second, from what one backend delivers."""
    if phase.rate_x <= 0 or backend_requests_per_s <= 0:
        raise ValueError("an open-loop phase and a positive backend rate are needed")
    return phase.rate_x * backend_requests_per_s


@dataclass(frozen=True, slots=True)
class Script:
    phases: tuple[Phase, ...]
    sweep_levels: tuple[int, ...]
    sweep_measure_s: float  # seconds of measurement per sweep level (wall)

    def __post_init__(self) -> None:
        if len({p.rate_x > 0 for p in self.phases}) > 1:
            raise ValueError("a script's phases are all open loop (rate_x > 0) or all closed loop")

    @property
    def open_loop(self) -> bool:
        return bool(self.phases) and self.phases[0].rate_x > 0

    @property
    def elastic(self) -> bool:
        """A further upstream joins in some phase: the demo starts a second simulator and an upstreams file."""
        return any(p.join for p in self.phases)

    @property
    def load_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def scaled(self, duration_scale: float) -> Script:
        """The same script with every phase and sweep level lasting ``duration_scale`` times as long."""
        if duration_scale <= 0:
            raise ValueError("duration_scale must be > 0")
        phases = tuple(replace(p, duration_s=p.duration_s * duration_scale) for p in self.phases)
        return replace(self, phases=phases, sweep_measure_s=self.sweep_measure_s * duration_scale)


DEFAULT_PHASES = (
    Phase("light", 4, 8.0, story="4 clients: the limit is not the bottleneck, so the controller holds"),
    # Long enough for the controller to check the knee around its start (it steps down and back up
    # before it settles) and then hold: the steady part judged is the last 70% of the phase.
    Phase(
        "surge",
        64,
        40.0,
        story="64 clients: the excess waits in the gateway's queue, the backend stays at its sweet spot",
    ),
    Phase(
        "slow backend",
        64,
        20.0,
        speed_factor=2.0,
        story="every engine step takes twice as long: half the tokens/s at the same concurrency",
    ),
    Phase("recovered", 64, 15.0, story="the backend is fast again"),
    Phase("calm", 16, 7.0, story="16 clients: below the sweet spot again, nothing queues"),
)

DEFAULT = Script(phases=DEFAULT_PHASES, sweep_levels=(16, 24, 32, 40, 48), sweep_measure_s=3.0)
# The CI variant: the same phases and code path, fewer and shorter sweep levels, phases 5x shorter.
QUICK = replace(DEFAULT.scaled(0.2), sweep_levels=(8, 16, 32), sweep_measure_s=2.0)

# The arrivals, as a multiple of one backend's requests/s: enough over one backend that its limit binds and the
# queue grows, little enough that two backends serve them well under target_utilisation (0.8) of their capacity
# (1.2 / 2 = 0.6), so the desired figure reads 2 before the join and stays there after it unless a window's
# capacity reading comes in a quarter low (requests/s over one window vary with the answers' lengths).
ELASTIC_RATE_X = 1.2
ELASTIC_PHASES = (
    # Long enough for the capacity signal: a backend's capacity counts once its limit has bound for a
    # whole window (window_s, 5 s at 2x), and only then is there a desired figure.
    Phase(
        "one backend",
        0,
        20.0,
        rate_x=ELASTIC_RATE_X,
        story="more arrivals than one backend delivers: the queue grows, and once the backend's capacity is "
        "measured sweetspot_upstreams_desired asks for 2",
    ),
    Phase(
        "second joins",
        0,
        30.0,
        rate_x=ELASTIC_RATE_X,
        join=True,
        story="a second simulator is added to the upstreams file: the gateway takes it in without a restart, at "
        "its sibling's limit, and the queue drains",
    ),
)
ELASTIC = Script(phases=ELASTIC_PHASES, sweep_levels=DEFAULT.sweep_levels, sweep_measure_s=DEFAULT.sweep_measure_s)
# The CI variant of --elastic: the quick sweep and 30 s of load. The phase before the join keeps most of its
# length (it must outlast a window at the limit), and its overload is clearer: in a short phase on a busy
# machine a 1.25x overload can leave the limit unbound for a moment in every window, and no capacity is measured.
QUICK_ELASTIC = Script(
    phases=(
        replace(ELASTIC_PHASES[0], duration_s=16.0, rate_x=1.5),
        replace(ELASTIC_PHASES[1], duration_s=14.0, rate_x=1.5),
    ),
    sweep_levels=QUICK.sweep_levels,
    sweep_measure_s=QUICK.sweep_measure_s,
)


def default_workload(seed: int = 0) -> Workload:
    """256-token prompts and answers of 64 to 192 tokens (mean 128: `sweetspot sweep`'s default shape),
    for the sweep and the load alike. The spread matters: closed-loop clients with equal answers move in
    lockstep, so a short measurement window would see either all of them start or none."""
    return Workload(prompt_len=LengthDist("fixed", 256), output_len=LengthDist("uniform", 64, 192), seed=seed)


def scaled_slo(time_scale: float) -> SLO:
    """The real-time objectives as wall-clock objectives of a simulator running ``time_scale`` x."""
    ttft, tpot = REAL_TIME_SLO.ttft_ms, REAL_TIME_SLO.tpot_ms
    assert ttft is not None and tpot is not None
    return SLO(ttft_ms=ttft / time_scale, tpot_ms=tpot / time_scale)


def gateway_env(time_scale: float, *, elastic: bool = False) -> dict[str, str]:
    """``SWEETSPOT_*`` variables that scale the gateway's time constants with the simulator."""
    from gateway.settings import Settings

    env: dict[str, str] = {}
    for name in SCALED_SETTINGS + (ELASTIC_SCALED_SETTINGS if elastic else ()):
        field = Settings.model_fields.get(name)
        if field is None or not isinstance(field.default, (int, float)) or isinstance(field.default, bool):
            continue
        env[f"SWEETSPOT_{name.upper()}"] = f"{field.default / time_scale:.6g}"
    return env


def is_judged(clients: int, reference: int | None) -> bool:
    """Whether the phase's demand exceeds the sweet spot enough for the limit to be the bottleneck."""
    return reference is not None and clients >= DEMAND_MARGIN * reference
