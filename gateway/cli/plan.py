"""``sweetspot plan``: how many sequences of each context fit on each GPU, with the arithmetic shown.

Numbers are taken as text and read by ``gateway.plan.units`` so that every bad value (``inf``, ``-3``,
``abc``) is refused with one line naming the flag, and exit status 2, like a bad config file.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gateway.cli import app


@app.command("plan")
def plan(
    gguf: Path | None = typer.Option(None, "--gguf", help="Read the shape from a local GGUF file."),
    hf_config: Path | None = typer.Option(None, "--hf-config", help="Read the shape from a Hugging Face config.json."),
    name: str | None = typer.Option(None, help="Model name for the report."),
    params: str | None = typer.Option(None, "--params", help="Total parameters, e.g. 35B (all experts of a MoE)."),
    active_params: str | None = typer.Option(None, "--active-params", help="Parameters used per token, e.g. 3B."),
    layers: str | None = typer.Option(None, help="Decoder layers."),
    kv_layers: str | None = typer.Option(
        None, "--kv-layers", help="Layers holding a KV cache (hybrids: the attention layers)."
    ),
    kv_heads: str | None = typer.Option(None, "--kv-heads", help="KV heads per attention layer."),
    head_dim: str | None = typer.Option(None, "--head-dim", help="Head dimension of K and V."),
    kv_latent_dim: str | None = typer.Option(
        None, "--kv-latent-dim", help="MLA: cached latent per token per layer (kv_lora_rank + qk_rope_head_dim)."
    ),
    sliding_window: str | None = typer.Option(
        None, "--sliding-window", help="Sliding-window size in tokens of the sliding layers."
    ),
    sliding_layers: str | None = typer.Option(
        None, "--sliding-layers", help="How many of the KV layers slide (the rest keep the whole context)."
    ),
    kv_dtype: str | None = typer.Option(
        None, "--kv-dtype", help="KV cache dtype: fp16, bf16, fp8, q8_0, q4_0, ... (default: model dtype, else fp16)."
    ),
    weight_quant: str | None = typer.Option(
        None, "--weight-quant", help="Weight format for params -> bytes: bf16, fp8, q8_0, q4_k_m, q4_0, ..."
    ),
    weights_gb: str | None = typer.Option(
        None, "--weights-gb", help="Weight size in GiB (e.g. the GGUF file size); beats --weight-quant."
    ),
    experts: str | None = typer.Option(None, help="Routed experts per MoE layer."),
    experts_used: str | None = typer.Option(None, "--experts-used", help="Routed experts used per token."),
    seq_state: str | None = typer.Option(
        None, "--seq-state", help="Linear-attention state per sequence, e.g. 62.8125MiB (hybrid models)."
    ),
    gpu_gb: list[str] | None = typer.Option(
        None, "--gpu-gb", help="GPU memory in GiB; repeat or comma-separate (default 16,24,32,48,80)."
    ),
    kv_cache_gb: str | None = typer.Option(
        None,
        "--kv-cache-gb",
        help="Plan a fixed KV budget in GiB instead of GPUs (vLLM --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE).",
    ),
    context: list[str] | None = typer.Option(
        None, "--context", help="Context per sequence (prompt+output): 4K,8K,... (default 4K,8K,16K,32K)."
    ),
    util: str = typer.Option(
        "0.9",
        "--gpu-memory-utilization",
        help="Fraction of GPU memory the engine may use (vLLM semantics; 1.0 for llama-server).",
    ),
    overhead_gb: str = typer.Option(
        "1.5", "--overhead-gb", help="Runtime overhead in GiB: CUDA context, activations, graphs."
    ),
    block_tokens: str = typer.Option(
        "1",
        "--block-tokens",
        help="KV allocation granularity in tokens for the planner's view (vLLM: 16, llama.cpp: 1).",
    ),
    batched_tokens: str | None = typer.Option(
        None,
        "--max-num-batched-tokens",
        help="vLLM's --max-num-batched-tokens for its view (default: vllm serve's, 2048, or 8192 on GPUs >= 70 GiB).",
    ),
    vllm_block: str = typer.Option(
        "16",
        "--vllm-block-size",
        help="vLLM's --block-size for its view (GPU default 16; read the CPU build's from its log).",
    ),
    vllm_batches: str = typer.Option(
        "2",
        "--vllm-concurrent-batches",
        help=(
            "Batches vLLM keeps in flight for its view: 2 with async scheduling (GPU default), 1 on the CPU build "
            "or with --no-async-scheduling."
        ),
    ),
    vllm_prefix_caching: bool = typer.Option(
        True,
        "--vllm-prefix-caching/--vllm-no-prefix-caching",
        help=(
            "vLLM's prefix caching for its view (vllm serve's default: on; hybrids then reserve two state pages "
            "per request)."
        ),
    ),
    bandwidth_gbs: str | None = typer.Option(
        None, "--bandwidth-gbs", help="Memory bandwidth in GB/s for a decode-speed ceiling."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Plan VRAM: weights, KV bytes per token, and max concurrent sequences per context and GPU, beside
    what vLLM will log for the same budget."""
    from gateway.plan import ModelShape, shape_from_gguf, shape_from_hf_config
    from gateway.plan.render import render
    from gateway.plan.report import DEFAULT_CONTEXTS, DEFAULT_GPUS_GB, build_report
    from gateway.plan.units import GIB, parse_bytes, parse_count, parse_finite, parse_int, parse_tokens, split_list

    def count(text: str | None, flag: str, minimum: int = 1) -> int | None:
        return parse_int(text, flag, minimum) if text is not None else None

    def positive(text: str | None, flag: str) -> float | None:
        return parse_finite(text, flag) if text is not None else None

    try:
        if gguf and hf_config:
            raise ValueError("give --gguf or --hf-config, not both")
        if kv_cache_gb is not None and gpu_gb:
            raise ValueError("give --kv-cache-gb (a fixed KV budget) or --gpu-gb, not both")
        for flag, path in (("--gguf", gguf), ("--hf-config", hf_config)):
            if path is not None and not path.is_file():
                raise ValueError(f"{flag} {path}: no such file")
        if gguf:
            shape = shape_from_gguf(gguf)
        elif hf_config:
            shape = shape_from_hf_config(hf_config)
        else:
            shape = ModelShape()
        weights = positive(weights_gb, "--weights-gb")
        total = parse_count(params) if params else None
        active = parse_count(active_params) if active_params else None
        head = count(head_dim, "--head-dim")
        shape = shape.override(
            name=name,
            total_params=total,
            active_params=active,
            layers=count(layers, "--layers"),
            kv_layers=count(kv_layers, "--kv-layers", 0),
            kv_heads=count(kv_heads, "--kv-heads"),
            head_dim=head,
            head_dim_v=head,
            kv_latent_dim=count(kv_latent_dim, "--kv-latent-dim"),
            sliding_window=count(sliding_window, "--sliding-window"),
            sliding_layers=count(sliding_layers, "--sliding-layers", 0),
            kv_dtype=kv_dtype,
            weight_quant=weight_quant,
            weight_bytes=round(weights * GIB) if weights is not None else None,
            experts=count(experts, "--experts"),
            experts_used=count(experts_used, "--experts-used"),
            seq_state_bytes=parse_bytes(seq_state) if seq_state else None,
        ).validate()
        gpus = [parse_finite(g, "--gpu-gb") for g in split_list(gpu_gb)] or list(DEFAULT_GPUS_GB)
        contexts = [parse_tokens(c) for c in split_list(context)] or list(DEFAULT_CONTEXTS)
        report = build_report(
            shape,
            gpus,
            contexts,
            parse_finite(util, "--gpu-memory-utilization"),
            parse_finite(overhead_gb, "--overhead-gb", inclusive=True),
            parse_int(block_tokens, "--block-tokens"),
            positive(bandwidth_gbs, "--bandwidth-gbs"),
            kv_cache_gb=positive(kv_cache_gb, "--kv-cache-gb"),
            max_num_batched_tokens=count(batched_tokens, "--max-num-batched-tokens"),
            vllm_block_size=parse_int(vllm_block, "--vllm-block-size"),
            vllm_concurrent_batches=parse_int(vllm_batches, "--vllm-concurrent-batches"),
            vllm_prefix_caching=vllm_prefix_caching,
        )
    except (ValueError, OSError) as exc:
        message = " ".join(str(exc).split())  # one line, whatever the source wrote
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(2) from None

    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        render(report)
