"""Showing a running sweep: a rich progress bar on a terminal, plain lines everywhere else.

Both are :data:`gateway.sweep.driver.Progress` callables. The plain one prints one line per level
event (never carriage returns or cursor moves), so CI logs and pipes stay readable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gateway.sweep.driver import Progress as ProgressCallback
from gateway.sweep.driver import SweepEvent
from gateway.sweep.result import LevelMetrics


def level_line(level: LevelMetrics) -> str:
    """One line summary of a finished level."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f} ms"

    text = (
        f"{level.output_tokens_per_s:8.1f} tok/s  {level.requests_per_s:6.2f} req/s  "
        f"p99 TTFT {ms(level.ttft_ms.p99)}  p99 TPOT {ms(level.tpot_ms.p99)}  "
        f"ok {level.completed}  failed {level.failed}  429/503 {level.rejected}"
    )
    if level.slo_violations:
        text += "  SLO: " + "; ".join(level.slo_violations)
    return text


class PlainProgress:
    """Line-by-line progress for logs: level start, end of warm-up, level result, early stop."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._phase: str | None = None

    def __call__(self, event: SweepEvent) -> None:
        prefix = f"[{event.level_index + 1}/{event.levels_total}] concurrency {event.concurrency}"
        if event.kind == "start":
            self.console.print(event.message, highlight=False, soft_wrap=True)
        elif event.kind == "level_start":
            self._phase = None
            self.console.print(f"{prefix}: warming up", highlight=False, soft_wrap=True)
        elif event.kind == "progress" and event.phase != self._phase:
            self._phase = event.phase
            if event.phase == "measure":
                self.console.print(f"{prefix}: measuring", highlight=False, soft_wrap=True)
        elif event.kind == "level_end" and event.level is not None:
            self.console.print(f"{prefix}: {level_line(event.level)}", highlight=False, soft_wrap=True)
        elif event.kind == "stop":
            self.console.print(event.message, highlight=False, soft_wrap=True)


class RichProgress:
    """Two bars: levels done, and the current level's phase (warm-up, measure, drain)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._levels: TaskID | None = None
        self._level: TaskID | None = None

    def __call__(self, event: SweepEvent) -> None:
        bar = self.bar
        if event.kind == "start":
            self._levels = bar.add_task("levels", total=event.levels_total)
            self._level = bar.add_task("", total=1)
            bar.console.print(event.message, highlight=False, soft_wrap=True)
        elif event.kind == "progress" and self._level is not None:
            label = {"warmup": "warm-up", "measure": "measure", "drain": "drain"}.get(event.phase, event.phase)
            description = f"concurrency {event.concurrency}: {label}"
            if event.phase == "drain":
                bar.update(self._level, description=description, completed=1, total=1)
            else:
                bar.update(
                    self._level, description=description, completed=int(event.done), total=max(1, int(event.total))
                )
        elif event.kind == "level_end" and event.level is not None and self._levels is not None:
            bar.advance(self._levels)
            bar.console.print(
                f"concurrency {event.concurrency:>4}: {level_line(event.level)}", highlight=False, soft_wrap=True
            )
        elif event.kind == "stop":
            bar.console.print(f"[yellow]{event.message}[/yellow]")
        elif event.kind == "done" and self._levels is not None:
            bar.update(self._levels, completed=event.levels_total)


@contextmanager
def sweep_progress(console: Console, *, quiet: bool = False) -> Iterator[ProgressCallback]:
    """The right progress display for ``console``: rich bars on a terminal, lines otherwise."""
    if quiet:
        yield lambda event: None
    elif console.is_terminal:
        display = RichProgress(console)
        with display.bar:
            yield display
    else:
        yield PlainProgress(console)
