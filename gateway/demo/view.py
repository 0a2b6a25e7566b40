"""The demo's live view: a rich ``Live`` panel on a terminal, plain periodic lines everywhere else.

Both views take the same calls (``phase_started``, ``update`` with each timeline sample, ``note``), so
the demo's loop does not know which one it drives. The plain view never moves the cursor or colours
its text: in a CI log or a pipe it prints one line per phase change and one every ``every_s`` seconds.
The elastic variant's samples carry every upstream and the capacity signal: both views show them too
(the plain one on a second line).
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gateway.demo.script import Phase
from gateway.demo.timeline import Sample, UpstreamSample


def _n(value: float | int | None, fmt: str = "{:.0f}", unit: str = "") -> str:
    return "-" if value is None else fmt.format(value) + unit


def decision_text(sample: Sample) -> str:
    if sample.action is None:
        return "no controller state (static limit)"
    text = f"{sample.action}: {sample.reason}"
    return text + (f"; last move {sample.last_move}" if sample.last_move else "")


def load_text(sample: Sample) -> str:
    if sample.arrivals_per_s is not None:
        return f"arrivals {sample.arrivals_per_s:5.1f}/s"
    return f"clients {sample.clients:>3}"


def upstream_text(u: UpstreamSample) -> str:
    """One upstream's limit, in-flight, tokens/s (the gateway window's) and measured capacity."""
    capacity = "" if u.capacity_requests_per_s is None else f" capacity {u.capacity_requests_per_s:.1f} req/s"
    return (
        f"limit {_n(u.limit)} in-flight {_n(u.inflight)} tok/s {_n(u.tokens_per_s)}{capacity}"
        + (" (retiring)" if u.retiring else "")
        + ("" if u.healthy is not False else " (not healthy)")
    )


def upstreams_text(sample: Sample) -> str:
    """Each upstream of the sample (the elastic variant)."""
    return " | ".join(f"{u.label} {upstream_text(u)}" for u in sample.upstreams)


def signal_text(sample: Sample) -> str:
    """The capacity signal: backends desired against serving, demand against one backend's capacity."""
    g = sample.signal
    if g is None:
        return "-"
    desired = "- (no backend measured at its limit yet)" if g.desired is None else str(g.desired)
    return (
        f"desired {desired}, serving {_n(g.serving)}; demand {_n(g.demand_requests_per_s, '{:.1f}', ' req/s')}, "
        f"one backend {_n(g.pool_requests_per_s, '{:.1f}', ' req/s')}"
    )


def plain_line(sample: Sample, phase_name: str) -> str:
    """One self-contained line per sample, for logs."""
    return (
        f"[{sample.t:6.1f}s] {phase_name:<13} {load_text(sample)}  limit {_n(sample.limit):>3}  "
        f"in-flight {_n(sample.inflight):>3}  queued {_n(sample.queued):>3}  "
        f"tok/s {_n(sample.tokens_per_s):>5}  p99 TTFT {_n(sample.ttft_p99_ms, unit=' ms')} "
        f"(clients {_n(sample.client_ttft_p99_ms, unit=' ms')})  p99 TPOT {_n(sample.tpot_p99_ms, '{:.1f}', ' ms')}  "
        f"KV {_n(None if sample.kv_usage is None else sample.kv_usage * 100, unit='%')}  | {decision_text(sample)}"
    )


class PlainView:
    def __init__(self, console: Console, phases: tuple[Phase, ...], every_s: float = 5.0) -> None:
        self.console = console
        self.phases = phases
        self.every_s = every_s
        self._last_print: float | None = None

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True, markup=False)

    def phase_started(
        self, index: int, phase: Phase, reference: int | None, at_s: float, arrivals_per_s: float | None = None
    ) -> None:
        slow = f", backend {phase.speed_factor:g}x slower" if phase.speed_factor != 1.0 else ""
        load = f"{phase.clients} clients" if arrivals_per_s is None else f"{arrivals_per_s:.1f} arrivals/s"
        self.note(
            f"--- [{at_s:6.1f}s] phase {index + 1}/{len(self.phases)}: {phase.name} "
            f"({load}{slow}, {phase.duration_s:.0f} s; reference sweet spot "
            f"{reference if reference is not None else '-'}): {phase.story}"
        )
        self._last_print = None

    def update(self, sample: Sample) -> None:
        if self._last_print is not None and sample.t - self._last_print < self.every_s:
            return
        self._last_print = sample.t
        self.note(plain_line(sample, self.phases[sample.phase].name))
        if sample.upstreams or sample.signal is not None:
            self.note(f"{'':9}upstreams: {upstreams_text(sample)}  | capacity signal: {signal_text(sample)}")


class LiveView:
    """A panel redrawn in place: the phase and what to watch for, then the numbers."""

    def __init__(self, console: Console, phases: tuple[Phase, ...]) -> None:
        self.console = console
        self.phases = phases
        self._sample: Sample | None = None
        self._phase_index = 0
        self._phase_start = 0.0
        self._reference: int | None = None
        self._arrivals: float | None = None
        self._live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._live.__exit__(exc_type, exc, tb)

    def note(self, text: str) -> None:
        self._live.console.print(text, highlight=False, soft_wrap=True, markup=False)

    def phase_started(
        self, index: int, phase: Phase, reference: int | None, at_s: float, arrivals_per_s: float | None = None
    ) -> None:
        self._phase_index, self._phase_start, self._reference = index, at_s, reference
        self._arrivals = arrivals_per_s
        slow = f", backend {phase.speed_factor:g}x slower" if phase.speed_factor != 1.0 else ""
        load = f"{phase.clients} clients" if arrivals_per_s is None else f"{arrivals_per_s:.1f} arrivals/s"
        self.note(f"[{at_s:6.1f}s] phase {index + 1}/{len(self.phases)}: {phase.name} ({load}{slow})")
        self._live.update(self._render())

    def update(self, sample: Sample) -> None:
        self._sample = sample
        self._live.update(self._render())

    def _render(self) -> Panel:
        phase = self.phases[self._phase_index]
        s = self._sample
        elapsed = (s.t - self._phase_start) if s is not None else 0.0
        title = (
            f"phase {self._phase_index + 1}/{len(self.phases)}: {phase.name}  ({elapsed:.0f}/{phase.duration_s:.0f} s)"
        )
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        ref = "-" if self._reference is None else str(self._reference)
        load = (
            ("clients", f"{phase.clients}")
            if self._arrivals is None
            else ("arrivals", f"{self._arrivals:.1f}/s (open loop)")
        )
        rows = [
            (
                load[0],
                load[1] + (f"   backend {phase.speed_factor:g}x slower" if phase.speed_factor != 1 else ""),
            ),
            ("limit", f"{_n(s.limit if s else None)}   (reference sweet spot {ref})"),
            ("in-flight", _n(s.inflight if s else None)),
            ("queued", _n(s.queued if s else None)),
            (
                "tokens/s",
                f"{_n(s.tokens_per_s if s else None)} (clients)   "
                f"{_n(s.gateway_tokens_per_s if s else None)} (gateway window)",
            ),
            (
                "p99 TTFT",
                f"{_n(s.ttft_p99_ms if s else None, unit=' ms')} backend   "
                f"{_n(s.client_ttft_p99_ms if s else None, unit=' ms')} clients (queue included)",
            ),
            ("p99 TPOT", _n(s.tpot_p99_ms if s else None, "{:.1f}", " ms")),
            (
                "backend",
                "-"
                if s is None
                else f"running {_n(s.backend_running)}  waiting {_n(s.backend_waiting)}  "
                f"KV {_n(None if s.kv_usage is None else s.kv_usage * 100, unit='%')}  "
                f"preemptions {_n(s.preemptions)}",
            ),
            ("decision", "-" if s is None else decision_text(s)),
        ]
        if s is not None and (s.upstreams or s.signal is not None):
            rows += [(u.label, upstream_text(u)) for u in s.upstreams]
            rows.append(("capacity", signal_text(s)))
        for label, value in rows:
            grid.add_row(label, value)
        return Panel(Group(Text(phase.story, style="italic"), grid), title=title, title_align="left")


def make_view(console: Console, phases: tuple[Phase, ...], *, plain: bool, every_s: float) -> PlainView | LiveView:
    """The rich view on a terminal (unless ``plain``), the plain one otherwise."""
    if console.is_terminal and not plain:
        return LiveView(console, phases)
    return PlainView(console, phases, every_s)
