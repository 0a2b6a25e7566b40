"""``sweetspot sim``: run the built-in simulator of a vLLM-like inference server."""

from __future__ import annotations

import typer

from gateway.cli import app


@app.command("sim")
def sim(
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8000, help="Port to bind; 0 picks a free one (see the 'listening on' line)."),
    profile: str = typer.Option("qwen3.6-35b-a3b-32gb", help="Model/GPU profile (--list-profiles shows them)."),
    time_scale: float = typer.Option(1.0, help="Run the engine this many times faster than real time."),
    model_name: str | None = typer.Option(None, help="Served model name (default: the profile's model)."),
    seed: int = typer.Option(0, help="Seed for every random draw (output lengths, injected errors)."),
    admin: bool = typer.Option(False, help="Enable POST /admin/scenario (speed, KV size, errors, stalls)."),
    max_model_len: int | None = typer.Option(None, help="Override the profile's context length."),
    max_num_seqs: int | None = typer.Option(None, help="Override the profile's max_num_seqs."),
    eos_mean_tokens: float | None = typer.Option(
        None, help="Requests without ignore_eos stop at a random length with this mean (default: run to max_tokens)."
    ),
    list_profiles: bool = typer.Option(False, "--list-profiles", help="Print the profiles and exit."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
    api_key: str | None = typer.Option(None, help="Require this bearer key on /v1/* (like vLLM's --api-key)."),
    prefix_caching: bool = typer.Option(True, help="Automatic prefix caching, vLLM V1's default."),
    enable_lora: bool = typer.Option(
        False, help="Serve LoRA adapters (implied by --lora-modules); adapters may be loaded at run time."
    ),
    lora_modules: list[str] | None = typer.Option(
        None, help="An adapter served from the start, as name=path (repeat the option for several)."
    ),
    max_loras: int = typer.Option(1, help="Distinct adapters one batch may hold (vLLM's --max-loras)."),
    max_cpu_loras: int | None = typer.Option(
        None, help="Adapters kept resident, least recently used out (vLLM's --max-cpu-loras; default max-loras)."
    ),
    lora_load_ms: float = typer.Option(
        40.0, help="Engine milliseconds a step takes longer for each adapter it must load (not resident)."
    ),
) -> None:
    """Serve an OpenAI-compatible, vLLM-shaped simulator whose throughput curve has a knee and a cliff."""
    import dataclasses

    from gateway.sim.profiles import PROFILES, get_profile

    if list_profiles:
        for p in PROFILES.values():
            typer.echo(f"{p.name}: {p.description} ({p.num_gpu_blocks} KV blocks, {p.kv_capacity_tokens} tokens)")
        raise typer.Exit()
    try:
        chosen = get_profile(profile)
        if max_model_len or max_num_seqs:
            chosen = dataclasses.replace(
                chosen,
                max_model_len=max_model_len or chosen.max_model_len,
                max_num_seqs=max_num_seqs or chosen.max_num_seqs,
            )
            chosen.validate()
    except (KeyError, ValueError) as exc:
        raise typer.BadParameter(str(exc.args[0]), param_hint="--profile") from None
    if time_scale <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--time-scale")
    from gateway.sim.lora import LoraConfig, parse_lora_module

    lora: LoraConfig | None = None
    if enable_lora or lora_modules:
        try:
            lora = LoraConfig(
                adapters=tuple(parse_lora_module(spec) for spec in lora_modules or []),
                max_loras=max_loras,
                max_cpu_loras=max_cpu_loras,
                load_s=lora_load_ms / 1000.0,
            )
            lora.validate()
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--lora-modules/--max-loras") from None

    from gateway.sim.http_app import SimConfig, serve

    config = SimConfig(
        profile=chosen,
        model_name=model_name,
        time_scale=time_scale,
        seed=seed,
        admin=admin,
        eos_mean_tokens=eos_mean_tokens,
        api_key=api_key,
        prefix_caching=prefix_caching,
        lora=lora,
    )
    serve(config, host=host, port=port, log_level=log_level)
