"""``sweetspot sweep``: measure a server level by level and report its concurrency sweet spot."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import typer

from gateway.cli import app

DEFAULT_LEVELS = "1,2,4,8,16,24,32,48,64"


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise typer.BadParameter(f"--levels takes comma-separated integers, got {text!r}") from None
    if not levels or any(level < 1 for level in levels):
        raise typer.BadParameter("--levels must be positive integers")
    return sorted(set(levels))


def _headers(values: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for value in values:
        name, sep, content = value.partition(":")
        if not sep or not name.strip():
            raise typer.BadParameter(f"--header takes 'Name: value', got {value!r}")
        headers[name.strip()] = content.strip()
    return headers


def _slo(value: float) -> float | None:
    return None if value <= 0 else value


@app.command("sweep")
def sweep(
    url: str = typer.Option(
        ..., "--url", help="Server base URL (a backend directly, or the gateway), e.g. http://127.0.0.1:8000."
    ),
    api: str = typer.Option(
        "chat",
        "--api",
        help="chat (/v1/chat/completions), completions (/v1/completions), "
        "responses (/v1/responses) or messages (Anthropic's /v1/messages).",
    ),
    model: str | None = typer.Option(None, "--model", help="Model name (default: the first of GET /v1/models)."),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="OPENAI_API_KEY", help="Bearer token, if the server wants one."
    ),
    header: list[str] = typer.Option([], "--header", "-H", help="Extra header 'Name: value' (repeatable)."),
    levels: str = typer.Option(DEFAULT_LEVELS, "--levels", help="Concurrency levels, comma-separated."),
    requests: int | None = typer.Option(
        None, "--requests", help="Measured requests per level (default: 4 per client, at least 16)."
    ),
    duration: float | None = typer.Option(
        None, "--duration", help="Seconds of measurement per level, instead of --requests."
    ),
    warmup: int | None = typer.Option(
        None, "--warmup", help="Warm-up requests per level, excluded (default: one per client)."
    ),
    warmup_s: float | None = typer.Option(None, "--warmup-s", help="Warm-up seconds per level, excluded."),
    rate: float | None = typer.Option(
        None, "--rate", help="Open loop: Poisson arrivals at this many req/s, capped at each level's concurrency."
    ),
    prompt_len: str = typer.Option(
        "256", "--prompt-len", help="Prompt tokens: N, A..B, uniform:A,B, normal:MEAN,STD, lognormal:MEAN,STD."
    ),
    output_len: str = typer.Option(
        "128", "--output-len", help="Output tokens (max_tokens), same forms as --prompt-len."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for lengths, prompts and Poisson arrivals."),
    ignore_eos: bool = typer.Option(
        True, "--ignore-eos/--no-ignore-eos", help="Ask the server to ignore EOS so outputs have the drawn length."
    ),
    extra_body: str | None = typer.Option(None, "--extra-body", help="JSON object merged into every request body."),
    slo_ttft_ms: float = typer.Option(2000.0, "--slo-ttft-ms", help="p99 TTFT objective in ms (0 disables)."),
    slo_tpot_ms: float = typer.Option(100.0, "--slo-tpot-ms", help="p99 TPOT objective in ms (0 disables)."),
    slo_e2e_ms: float = typer.Option(0.0, "--slo-e2e-ms", help="p99 end-to-end objective in ms (0 disables)."),
    fraction: float = typer.Option(
        0.9, "--fraction", help="Sweet spot: smallest concurrency reaching this fraction of peak tokens/s."
    ),
    cliff_tolerance: float = typer.Option(
        0.10, "--cliff-tolerance", help="A drop of tokens/s by more than this fraction of the best so far is a cliff."
    ),
    max_error_rate: float = typer.Option(
        0.01, "--max-error-rate", help="A level with a larger share of failed requests is a cliff."
    ),
    early_stop: bool = typer.Option(True, "--early-stop/--no-early-stop", help="Stop at the first cliff."),
    timeout: float = typer.Option(600.0, "--timeout", help="Per-request timeout in seconds."),
    level_timeout: float = typer.Option(600.0, "--level-timeout", help="Time limit for one level in seconds."),
    out: Path | None = typer.Option(
        None, "--out", help="Directory for sweep.json, sweep.md, sweep.png (default runs/sweep-<time>)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output; only the final table."),
) -> None:
    """Sweep concurrency levels and report peak tokens/s, the sweet spot and the cliff."""
    from rich.console import Console

    from gateway.sweep.driver import SweepConfig, SweepError, run_sweep_sync
    from gateway.sweep.progress import sweep_progress
    from gateway.sweep.result import SLO
    from gateway.sweep.tables import headline, rich_table, write_report
    from gateway.sweep.workload import Workload, parse_length

    if api not in ("chat", "completions", "responses", "messages"):
        raise typer.BadParameter("--api must be chat, completions, responses or messages")
    if requests is not None and duration is not None:
        raise typer.BadParameter("give --requests or --duration, not both")
    try:
        body = json.loads(extra_body) if extra_body else {}
        if not isinstance(body, dict):
            raise ValueError("--extra-body must be a JSON object")
        config = SweepConfig(
            url=url,
            api=api,  # type: ignore[arg-type]
            model=model,
            api_key=api_key,
            headers=_headers(header),
            levels=_levels(levels),
            requests_per_level=requests,
            duration_s=duration,
            warmup_requests=warmup,
            warmup_s=warmup_s,
            rate=rate,
            workload=Workload(
                api=api,  # type: ignore[arg-type]
                prompt_len=parse_length(prompt_len),
                output_len=parse_length(output_len),
                ignore_eos=ignore_eos,
                seed=seed,
                extra_body=body,
            ),
            slo=SLO(ttft_ms=_slo(slo_ttft_ms), tpot_ms=_slo(slo_tpot_ms), e2e_ms=_slo(slo_e2e_ms)),
            fraction=fraction,
            cliff_tolerance=cliff_tolerance,
            max_error_rate=max_error_rate,
            early_stop=early_stop,
            request_timeout_s=timeout,
            level_timeout_s=level_timeout,
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    console = Console()
    if not console.is_terminal:  # logs and pipes: wide enough for the table, no wrapping mid-line
        console = Console(width=max(console.width, 140))
    out_dir = out or Path("runs") / f"sweep-{datetime.now():%Y%m%d-%H%M%S}"
    try:
        with sweep_progress(console, quiet=quiet) as progress:
            result = run_sweep_sync(config, progress)
    except SweepError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("interrupted; nothing written", err=True)
        raise typer.Exit(130) from None
    files = write_report(result, out_dir)
    console.print(rich_table(result))
    for line in headline(result):
        console.print(line, highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(f"wrote {files.json}, {files.markdown}, {files.png}", highlight=False)
