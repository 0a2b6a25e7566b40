"""The plan's report (:func:`gateway.plan.report.build_report`) as rich tables, for ``sweetspot plan``.

The tables are drawn from the same dict the JSON holds, so the two can never disagree. A GPU whose budget the
weights alone exceed shows "does not fit" in every cell, never a number; a context too long for even one
sequence shows 0 with the memory one sequence would need.
"""

from __future__ import annotations

from typing import Any

from gateway.plan.units import GIB, MIB


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _params(value: float | None) -> str:
    return "?" if value is None else f"{value / 1e9:.2f}B"


def _ctx(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def _layers_cell(model: dict[str, Any]) -> str:
    kinds = []
    full = (
        model["kv_layers"] - model["sliding_layers"] - model["chunked_layers"]
        if model["kv_layers"] is not None
        else None
    )
    if full:
        kinds.append(f"{full} full")
    if model["sliding_layers"]:
        kinds.append(f"{model['sliding_layers']} sliding ({model['sliding_window']:,})")
    if model["chunked_layers"]:
        kinds.append(f"{model['chunked_layers']} chunked ({model['attention_chunk']:,})")
    if model["state_layers"]:
        kinds.append(f"{model['state_layers']} linear-attention")
    return f"{model['layers']}: " + ", ".join(kinds) if kinds else f"{model['layers']} / {model['kv_layers']}"


def _row_label(gpu: dict[str, Any]) -> str:
    return f"{gpu['gpu_gb']:g} GB" if gpu["gpu_gb"] is not None else f"KV {gpu['kv_cache_gb']:g} GiB"


def render(report: dict[str, Any], console: Any | None = None) -> None:
    """Print the report as rich tables."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    model = report["model"]
    sources = model["sources"]

    summary = Table(title=f"Model: {model['name']}", box=box.SIMPLE_HEAD, show_header=True)
    summary.add_column("quantity")
    summary.add_column("value", justify="right")
    summary.add_column("from", style="dim")
    moe = f" ({model['experts_used']} of {model['experts']} experts)" if model["experts"] else ""
    if model["kv_latent_dim"]:
        heads = ("MLA latent per token per layer", f"{model['kv_latent_dim']} values", sources.get("kv_latent_dim", ""))
        kv_formula = "KV layers x latent x dtype"
    else:
        heads = ("KV heads x head dim", f"{model['kv_heads']} x {model['head_dim']}", sources.get("kv_heads", ""))
        kv_formula = "2 x KV layers x heads x dim x dtype"
    weights = _gib(report["weight_bytes"]) if report["weight_bytes"] else "not needed (fixed KV budget)"
    rows = [
        (
            "parameters: total / active",
            f"{_params(model['total_params'])} / {_params(model['active_params'])}{moe}",
            sources.get("total_params", ""),
        ),
        ("weights (resident, counted once)", weights, sources.get("weight_bytes", sources.get("weight_quant", ""))),
        ("weight format", str(model["weight_quant"]), sources.get("weight_quant", "")),
        ("weights read per token", _gib(report["active_weight_bytes"]), "weights x active/total"),
        ("layers", _layers_cell(model), sources.get("kv_layers", "")),
        heads,
        ("KV bytes per token (all KV layers)", f"{report['kv_bytes_per_token']:,} B ({model['kv_dtype']})", kv_formula),
        (
            "state per sequence",
            f"{report['seq_state_bytes'] / MIB:.2f} MiB",
            sources.get("seq_state_bytes", "none (no linear attention)"),
        ),
    ]
    if report["kv_cache_gb"] is None:
        rows.append(
            ("utilisation / overhead", f"{report['utilization']:.2f} / {report['overhead_gb']:.2f} GiB", "flags")
        )
    if model["context_length"]:
        rows.append(("native context", f"{model['context_length']:,}", ""))
    for row in rows:
        summary.add_row(*row)
    console.print(summary)

    memory = Table(title="Memory per GPU (GiB = 2^30 bytes)", box=box.SIMPLE_HEAD)
    for col in ("GPU", "budget", "weights", "overhead", "left for KV", "KV tokens", "verdict"):
        memory.add_column(col, justify="right" if col != "verdict" else "left")
    for gpu in report["gpus"]:
        tokens = gpu["kv_capacity_tokens"]
        verdict = "fits" if gpu["fits"] else f"[red]does not fit: short {_gib(-gpu['kv_memory_bytes'])}[/red]"
        memory.add_row(
            _row_label(gpu),
            _gib(gpu["budget_bytes"]),
            _gib(gpu["weight_bytes"]),
            _gib(gpu["overhead_bytes"]),
            _gib(gpu["kv_memory_bytes"]) if gpu["fits"] else "[red]none[/red]",
            "n/a" if tokens is None else f"{tokens:,}",
            gpu["verdict"] if gpu["gpu_gb"] is None else verdict,
        )
    console.print(memory)

    block = f", {report['block_tokens']}-token blocks" if report["block_tokens"] > 1 else ""
    seqs = Table(title=f"Max concurrent sequences (context = prompt + output per sequence{block})", box=box.SIMPLE_HEAD)
    seqs.add_column("GPU")
    for ctx in report["contexts"]:
        seqs.add_column(_ctx(ctx), justify="right")
    for gpu in report["gpus"]:
        cells = []
        for ctx in report["contexts"]:
            n = gpu["max_sequences"][str(ctx)]
            if n is None:
                cells.append("[red]does not fit[/red]")
            elif n == 0:
                cells.append(f"[yellow]0 (1 seq needs {_gib(report['sequence_bytes'][str(ctx)])})[/yellow]")
            else:
                cells.append(f"{n:,}")
        seqs.add_row(_row_label(gpu), *cells)
    console.print(seqs)

    views = [gpu for gpu in report["gpus"] if gpu["vllm"]]
    if views:
        v0 = views[0]["vllm"]
        title = (
            f"What vLLM will log, --max-model-len = context (block {v0['block_size']}, "
            f"{v0['groups']} KV group(s) of {v0['group_size']} layers)"
        )
        table = Table(title=title, box=box.SIMPLE_HEAD)
        table.add_column("GPU")
        table.add_column("batched tokens", justify="right")
        for ctx in report["contexts"]:
            table.add_column(f"{_ctx(ctx)}: KV tokens, max conc.", justify="right")
        for gpu in views:
            view = gpu["vllm"]
            cells = []
            for ctx in report["contexts"]:
                cell = view["by_context"][str(ctx)]
                text = f"{cell['kv_cache_tokens']:,}, {cell['max_concurrency']:.2f}x"
                cells.append(text if cell["starts"] else f"[red]{text} (refuses to start)[/red]")
            table.add_row(_row_label(gpu), f"{view['max_num_batched_tokens']:,}", *cells)
        console.print(table)
        for note in report["vllm_differs"]:
            console.print(f"[dim]- {note}[/dim]")

    decode = report["decode"]
    if decode:
        dtable = Table(
            title=f"Decode ceiling from {decode['bandwidth_gbs']:g} GB/s memory bandwidth (tokens/s)",
            box=box.SIMPLE_HEAD,
        )
        for col in ("context", "1 stream", "GPU", "batch", "batch ceiling", "uniform-routing est."):
            dtable.add_column(col, justify="right")
        by_ctx: dict[int, list[dict[str, Any]]] = {}
        for entry in decode["batch"]:
            by_ctx.setdefault(entry["context"], []).append(entry)
        for ctx in report["contexts"]:
            single = f"{decode['single_stream_tokens_per_s'][str(ctx)]:,.0f}"
            entries = by_ctx.get(ctx, [])
            if not entries:
                dtable.add_row(_ctx(ctx), single, "-", "-", "no GPU fits a sequence", "")
            for i, entry in enumerate(entries):
                lead = (_ctx(ctx), single) if i == 0 else ("", "")
                est = entry["tokens_per_s_uniform_routing"]
                gpu_label = f"{entry['gpu_gb']:g} GB" if entry["gpu_gb"] is not None else "KV budget"
                dtable.add_row(
                    *lead,
                    gpu_label,
                    str(entry["batch"]),
                    f"{entry['tokens_per_s_bound']:,.0f}",
                    "" if est is None else f"{est:,.0f}",
                )
        console.print(dtable)
        console.print(
            "[dim]Ceilings assume every byte moves at full bandwidth; measured speed is lower. "
            "Batch = the max sequences above.[/dim]"
        )

    if report["assumptions"]:
        console.print("Assumptions:")
        for note in report["assumptions"]:
            console.print(f"  - {note}")
    for warning in report["warnings"]:
        console.print(f"[yellow]warning: {warning}[/yellow]")
