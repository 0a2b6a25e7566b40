"""The plan as data (``build_report``, what ``--json`` prints) and as rich tables (``render``).

The tables are drawn from the same dict the JSON holds, so the two can never disagree. A GPU whose
budget the weights alone exceed shows "does not fit" in every cell (JSON: ``null``), never a number; a
context too long for even one sequence shows 0 with the memory one sequence would need.
"""

from __future__ import annotations

from typing import Any, Sequence

from gateway.plan.arith import plan_capacity
from gateway.plan.decode import decode_bound
from gateway.plan.shape import ModelShape
from gateway.plan.units import GIB, MIB

DEFAULT_GPUS_GB = (16.0, 24.0, 32.0, 48.0, 80.0)
DEFAULT_CONTEXTS = (4096, 8192, 16384, 32768)


def build_report(
    shape: ModelShape,
    gpus_gb: Sequence[float],
    contexts: Sequence[int],
    util: float,
    overhead_gb: float,
    block_tokens: int = 1,
    bandwidth_gbs: float | None = None,
) -> dict[str, Any]:
    """Every number the plan shows, as JSON-ready values."""
    plans = [plan_capacity(shape, gb, util, overhead_gb) for gb in gpus_gb]
    first = plans[0]
    gpus = []
    for gb, plan in zip(gpus_gb, plans):
        gpus.append(
            {
                "gpu_gb": gb,
                "gpu_bytes": plan.gpu_bytes,
                "budget_bytes": plan.budget_bytes,
                "weight_bytes": plan.weight_bytes,
                "overhead_bytes": plan.overhead_bytes,
                "kv_memory_bytes": plan.kv_memory_bytes,
                "fits": plan.fits,
                "verdict": plan.verdict,
                "kv_capacity_tokens": plan.kv_capacity_tokens,
                "max_sequences": {
                    str(ctx): (plan.max_sequences(ctx, block_tokens) if plan.fits else None) for ctx in contexts
                },
            }
        )
    report: dict[str, Any] = {
        "model": shape.describe(),
        "weight_bytes": first.weight_bytes,
        "active_weight_bytes": shape.active_weight_bytes,
        "kv_bytes_per_token": first.kv_bytes_per_token,
        "seq_state_bytes": first.seq_state_bytes,
        "sequence_bytes": {str(ctx): first.sequence_bytes(ctx, block_tokens) for ctx in contexts},
        "utilization": util,
        "overhead_gb": overhead_gb,
        "block_tokens": block_tokens,
        "contexts": list(contexts),
        "gpus": gpus,
        "decode": None,
    }
    if bandwidth_gbs is not None:
        single = {str(ctx): decode_bound(first, bandwidth_gbs, ctx, 1).tokens_per_s for ctx in contexts}
        batches = []
        for gb, plan in zip(gpus_gb, plans):
            for ctx in contexts:
                n = plan.max_sequences(ctx, block_tokens) if plan.fits else 0
                if n <= 0:
                    continue
                bound = decode_bound(plan, bandwidth_gbs, ctx, n)
                batches.append(
                    {
                        "gpu_gb": gb,
                        "context": ctx,
                        "batch": n,
                        "tokens_per_s_bound": bound.tokens_per_s,
                        "tokens_per_s_uniform_routing": bound.uniform_routing_tokens_per_s,
                    }
                )
        report["decode"] = {"bandwidth_gbs": bandwidth_gbs, "single_stream_tokens_per_s": single, "batch": batches}
    return report


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _params(value: float | None) -> str:
    return "?" if value is None else f"{value / 1e9:.2f}B"


def _ctx(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


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
    rows = [
        ("parameters: total / active", f"{_params(model['total_params'])} / {_params(model['active_params'])}{moe}", sources.get("total_params", "")),
        ("weights (resident, counted once)", _gib(report["weight_bytes"]), sources.get("weight_bytes", sources.get("weight_quant", ""))),
        ("weights read per token", _gib(report["active_weight_bytes"]), "weights x active/total"),
        ("layers / KV-bearing layers", f"{model['layers']} / {model['kv_layers']}", sources.get("kv_layers", "")),
        ("KV heads x head dim", f"{model['kv_heads']} x {model['head_dim']}", sources.get("kv_heads", "")),
        ("KV bytes per token", f"{report['kv_bytes_per_token']:,} B ({model['kv_dtype']})", "2 x KV layers x heads x dim x dtype"),
        ("state per sequence", f"{report['seq_state_bytes'] / MIB:.2f} MiB", sources.get("seq_state_bytes", "none (no linear attention)")),
        ("utilisation / overhead", f"{report['utilization']:.2f} / {report['overhead_gb']:.2f} GiB", "flags"),
    ]
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
        memory.add_row(
            f"{gpu['gpu_gb']:g} GB",
            _gib(gpu["budget_bytes"]),
            _gib(gpu["weight_bytes"]),
            _gib(gpu["overhead_bytes"]),
            _gib(gpu["kv_memory_bytes"]) if gpu["fits"] else "[red]none[/red]",
            "n/a" if tokens is None else f"{tokens:,}",
            "fits" if gpu["fits"] else f"[red]does not fit: short {_gib(-gpu['kv_memory_bytes'])}[/red]",
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
        seqs.add_row(f"{gpu['gpu_gb']:g} GB", *cells)
    console.print(seqs)

    decode = report["decode"]
    if decode:
        table = Table(title=f"Decode ceiling from {decode['bandwidth_gbs']:g} GB/s memory bandwidth (tokens/s)", box=box.SIMPLE_HEAD)
        for col in ("context", "1 stream", "GPU", "batch", "batch ceiling", "uniform-routing est."):
            table.add_column(col, justify="right")
        by_ctx: dict[int, list[dict[str, Any]]] = {}
        for row in decode["batch"]:
            by_ctx.setdefault(row["context"], []).append(row)
        for ctx in report["contexts"]:
            single = f"{decode['single_stream_tokens_per_s'][str(ctx)]:,.0f}"
            rows_for = by_ctx.get(ctx) or [None]
            for i, row in enumerate(rows_for):
                lead = (_ctx(ctx), single) if i == 0 else ("", "")
                if row is None:
                    table.add_row(*lead, "-", "-", "no GPU fits a sequence", "")
                    continue
                est = row["tokens_per_s_uniform_routing"]
                table.add_row(
                    *lead, f"{row['gpu_gb']:g} GB", str(row["batch"]), f"{row['tokens_per_s_bound']:,.0f}",
                    "" if est is None else f"{est:,.0f}",
                )
        console.print(table)
        console.print(
            "[dim]Ceilings assume every byte moves at full bandwidth; measured speed is lower. "
            "Batch = the max sequences above.[/dim]"
        )
