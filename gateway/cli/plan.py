"""``sweetspot plan``: how many sequences of each context fit on each GPU, with the arithmetic shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from gateway.cli import app


@app.command("plan")
def plan(
    gguf: Optional[Path] = typer.Option(None, "--gguf", exists=True, dir_okay=False, help="Read the shape from a local GGUF file."),
    hf_config: Optional[Path] = typer.Option(None, "--hf-config", exists=True, dir_okay=False, help="Read the shape from a Hugging Face config.json."),
    name: Optional[str] = typer.Option(None, help="Model name for the report."),
    params: Optional[str] = typer.Option(None, "--params", help="Total parameters, e.g. 35B (all experts of a MoE)."),
    active_params: Optional[str] = typer.Option(None, "--active-params", help="Parameters used per token, e.g. 3B."),
    layers: Optional[int] = typer.Option(None, help="Decoder layers."),
    kv_layers: Optional[int] = typer.Option(None, "--kv-layers", help="Layers holding a KV cache (hybrids: the full-attention layers)."),
    kv_heads: Optional[int] = typer.Option(None, "--kv-heads", help="KV heads per attention layer."),
    head_dim: Optional[int] = typer.Option(None, "--head-dim", help="Head dimension of K and V."),
    kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help="KV cache dtype: fp16, bf16, fp8, q8_0, q4_0, ... (default: model dtype, else fp16)."),
    weight_quant: Optional[str] = typer.Option(None, "--weight-quant", help="Weight format for params -> bytes: bf16, fp8, q8_0, q4_k_m, q4_0, ..."),
    weights_gb: Optional[float] = typer.Option(None, "--weights-gb", help="Weight size in GiB (e.g. the GGUF file size); beats --weight-quant."),
    experts: Optional[int] = typer.Option(None, help="Routed experts per MoE layer."),
    experts_used: Optional[int] = typer.Option(None, "--experts-used", help="Routed experts used per token."),
    seq_state: Optional[str] = typer.Option(None, "--seq-state", help="Linear-attention state per sequence, e.g. 62.8125MiB (hybrid models)."),
    gpu_gb: Optional[list[str]] = typer.Option(None, "--gpu-gb", help="GPU memory in GiB; repeat or comma-separate (default 16,24,32,48,80)."),
    context: Optional[list[str]] = typer.Option(None, "--context", help="Context per sequence (prompt+output): 4K,8K,... (default 4K,8K,16K,32K)."),
    util: float = typer.Option(0.9, "--gpu-memory-utilization", help="Fraction of GPU memory the engine may use (vLLM semantics; 1.0 for llama-server)."),
    overhead_gb: float = typer.Option(1.5, "--overhead-gb", help="Runtime overhead in GiB: CUDA context, activations, graphs."),
    block_tokens: int = typer.Option(1, "--block-tokens", help="KV allocation granularity in tokens (vLLM: 16, llama.cpp: 1)."),
    bandwidth_gbs: Optional[float] = typer.Option(None, "--bandwidth-gbs", help="Memory bandwidth in GB/s for a decode-speed ceiling."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Plan VRAM: weights, KV bytes per token, and max concurrent sequences per context and GPU."""
    from gateway.plan import ModelShape, shape_from_gguf, shape_from_hf_config
    from gateway.plan.report import DEFAULT_CONTEXTS, DEFAULT_GPUS_GB, build_report, render
    from gateway.plan.units import GIB, parse_bytes, parse_count, parse_tokens, split_list

    if gguf and hf_config:
        raise typer.BadParameter("give --gguf or --hf-config, not both")
    try:
        if gguf:
            shape = shape_from_gguf(gguf)
        elif hf_config:
            shape = shape_from_hf_config(hf_config)
        else:
            shape = ModelShape()
        shape = shape.override(
            name=name,
            total_params=parse_count(params) if params else None,
            active_params=parse_count(active_params) if active_params else None,
            layers=layers,
            kv_layers=kv_layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            head_dim_v=head_dim,
            kv_dtype=kv_dtype,
            weight_quant=weight_quant,
            weight_bytes=int(round(weights_gb * GIB)) if weights_gb is not None else None,
            experts=experts,
            experts_used=experts_used,
            seq_state_bytes=parse_bytes(seq_state) if seq_state else None,
        )
        gpus = [float(g) for g in split_list(gpu_gb)] or list(DEFAULT_GPUS_GB)
        contexts = [parse_tokens(c) for c in split_list(context)] or list(DEFAULT_CONTEXTS)
        if block_tokens <= 0:
            raise ValueError("--block-tokens must be positive")
        report = build_report(shape, gpus, contexts, util, overhead_gb, block_tokens, bandwidth_gbs)
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        render(report)
