"""``sweetspot demo``: simulator, sweep, gateway at the sweet spot, changing load, and a summary."""

from __future__ import annotations

from pathlib import Path

import typer

from gateway.cli import app


@app.command("demo")
def demo(
    out: Path | None = typer.Option(
        None, "--out", help="Directory for every file the demo writes (default out/demo-<time>)."
    ),
    time_scale: float = typer.Option(
        2.0,
        "--time-scale",
        help="Run the simulator, the SLOs and the controller's periods this many times faster than real time.",
    ),
    duration_scale: float = typer.Option(
        1.0, "--duration-scale", help="Multiply every load phase and sweep level duration by this."
    ),
    quick: bool = typer.Option(
        False, "--quick", help="The short variant CI runs: fewer sweep levels, phases 5x shorter."
    ),
    profile: str = typer.Option(
        "qwen3.6-35b-a3b-32gb", "--profile", help="Simulator profile (sweetspot sim --list-profiles)."
    ),
    levels: str | None = typer.Option(None, "--levels", help="Sweep levels, comma-separated (default 16,24,32,48)."),
    seed: int = typer.Option(0, "--seed", help="Seed for the simulator and the request stream."),
    plain: bool = typer.Option(
        False, "--plain", help="Plain log lines even on a terminal (the default when not a TTY)."
    ),
    print_every: float = typer.Option(5.0, "--print-every", help="Plain output: seconds between status lines."),
    strict: bool = typer.Option(
        False, "--strict", help="Exit 1 when the controller misses +-25% of the sweet spot in a judged phase."
    ),
    elastic: bool = typer.Option(
        False,
        "--elastic",
        help="A backend joins: more arrivals than one simulator can take, then a second one joins the running "
        "gateway through its upstreams_file; shows the capacity signal (sweetspot_upstreams_desired) and the join.",
    ),
) -> None:
    """Start the simulator and the gateway, sweep, drive a changing load, and show where the controller held."""
    from rich.console import Console

    from gateway.demo.run import DemoOptions, default_out_dir, run_demo

    if time_scale <= 0 or duration_scale <= 0 or print_every <= 0:
        raise typer.BadParameter("--time-scale, --duration-scale and --print-every must be > 0")
    parsed: tuple[int, ...] | None = None
    if levels:
        try:
            parsed = tuple(int(part) for part in levels.split(",") if part.strip())
        except ValueError:
            raise typer.BadParameter(f"--levels takes comma-separated integers, got {levels!r}") from None
        if not parsed or min(parsed) < 1:
            raise typer.BadParameter("--levels must be positive integers")
    console = Console()
    if not console.is_terminal:  # logs and pipes: wide enough for the tables, no wrapping mid-line
        console = Console(width=max(console.width, 150))
    options = DemoOptions(
        out=out or default_out_dir(),
        time_scale=time_scale,
        duration_scale=duration_scale,
        quick=quick,
        profile=profile,
        seed=seed,
        plain=plain,
        print_every_s=print_every,
        levels=parsed,
        strict=strict,
        elastic=elastic,
    )
    outcome = run_demo(options, console)
    raise typer.Exit(outcome.exit_code)
