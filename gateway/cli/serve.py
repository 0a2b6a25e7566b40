"""``sweetspot serve``: run the gateway under uvicorn."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli import app


@app.command("serve")
def serve(
    upstream: Annotated[
        list[str] | None, typer.Option("--upstream", "-u", help="Upstream base URL (repeatable).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Listen address [env SWEETSPOT_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port [env SWEETSPOT_PORT].")] = None,
    workers: Annotated[
        int | None, typer.Option(help="Worker processes on the one port [env SWEETSPOT_WORKERS].")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML settings file.")] = None,
    backend: Annotated[str | None, typer.Option(help="auto, vllm, llamacpp or openai.")] = None,
    initial_limit: Annotated[int | None, typer.Option(help="Concurrency limit per upstream at start.")] = None,
    max_queue: Annotated[int | None, typer.Option(help="Queue size before 429.")] = None,
    queue_timeout_s: Annotated[float | None, typer.Option(help="Queue wait before 503.")] = None,
    routing: Annotated[str | None, typer.Option(help="prefix, least_loaded or random (several upstreams).")] = None,
    control: Annotated[bool | None, typer.Option("--control/--no-control", help="AIMD controller on/off.")] = None,
    algorithm: Annotated[
        str | None,
        typer.Option(
            help="module:factory of another limit algorithm in the controller's place [env SWEETSPOT_ALGORITHM]."
        ),
    ] = None,
    sweep_result: Annotated[Path | None, typer.Option(help="`sweetspot sweep` JSON: start at its sweet spot.")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
) -> None:
    """Run the gateway. Every option can also come from SWEETSPOT_* env vars or the TOML file."""
    from pydantic import ValidationError

    from gateway.server.process.launch import run

    try:
        run(
            config=config,
            upstreams=upstream or None,
            host=host,
            port=port,
            workers=workers,
            backend=backend,
            initial_limit=initial_limit,
            max_queue=max_queue,
            queue_timeout_s=queue_timeout_s,
            control_enabled=control,
            algorithm=algorithm,
            routing=routing,
            sweep_result=sweep_result,
            log_level=log_level,
        )
    except (ValueError, FileNotFoundError) as exc:
        # Bad settings from any source (ValidationError and SweepResultError are ValueErrors) end here,
        # with the reason and without a traceback.
        message = str(exc) if not isinstance(exc, ValidationError) else _describe(exc)
        typer.echo(f"sweetspot serve: {message}", err=True)
        raise typer.Exit(2) from None


def _describe(exc: Any) -> str:
    parts = [f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}" for err in exc.errors()]
    return "invalid settings: " + "; ".join(parts)
