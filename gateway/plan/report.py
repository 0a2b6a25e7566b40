"""The plan as data (``build_report``, what ``--json`` prints; :mod:`gateway.plan.render` draws it as tables).

A GPU whose budget the weights alone exceed has ``null`` in every cell, never a number; a context too long
for even one sequence has 0 with the memory one sequence would need. Beside the planner's per-sequence
counts, each GPU row carries what vLLM will log for the same KV memory (``vllm``), and the report lists how
the two differ for this model, every assumption made, and a warning for each context past the model's
native length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.plan.arith import CapacityPlan, plan_capacity, plan_fixed_kv
from gateway.plan.decode import decode_bound
from gateway.plan.shape import ModelShape
from gateway.plan.vllm_view import (
    VLLM_BLOCK_SIZE,
    VLLM_GPU_CONCURRENT_BATCHES,
    LayerSpec,
    layer_specs,
    vllm_kv_view,
)

DEFAULT_GPUS_GB = (16.0, 24.0, 32.0, 48.0, 80.0)
DEFAULT_CONTEXTS = (4096, 8192, 16384, 32768)


def _vllm_batched_tokens(gpu_gb: float | None, given: int | None) -> int:
    """``vllm serve``'s default --max-num-batched-tokens: 8192 on GPUs of 70 GiB or more (A100 aside),
    else 2048; it sets how far past its window a sliding layer reserves blocks."""
    if given is not None:
        return given
    return 8192 if gpu_gb is not None and gpu_gb >= 70 else 2048


def _vllm_cells(
    plan: CapacityPlan,
    specs: list[LayerSpec],
    contexts: Sequence[int],
    block: int,
    batched: int,
    batches: int,
    prefix_caching: bool,
) -> dict[str, Any] | None:
    if not plan.fits:
        return None
    cells: dict[str, Any] = {}
    for ctx in contexts:
        view = vllm_kv_view(
            specs, plan.kv_memory_bytes, ctx, block, batched, concurrent_batches=batches, prefix_caching=prefix_caching
        )
        if view is None:
            return None
        cells[str(ctx)] = {
            "kv_cache_tokens": view.kv_cache_tokens,
            "max_concurrency": round(view.max_concurrency, 2),
            "starts": view.starts,
            "num_blocks": view.num_blocks,
            "blocks_per_request": view.blocks_per_request,
        }
    first = vllm_kv_view(
        specs,
        plan.kv_memory_bytes,
        contexts[0],
        block,
        batched,
        concurrent_batches=batches,
        prefix_caching=prefix_caching,
    )
    assert first is not None
    return {
        "max_num_batched_tokens": batched,
        "concurrent_batches": batches,
        "prefix_caching": prefix_caching,
        "block_size": first.block_size,
        "page_bytes": first.page_bytes,
        "groups": first.groups,
        "group_size": first.group_size,
        "padding_layers": first.padding_layers,
        "by_context": cells,
    }


def _difference(shape: ModelShape, specs: list[LayerSpec]) -> list[str]:
    """How vLLM's logged figures differ from the planner's for this model, in words."""
    notes = [
        "vLLM's maximum concurrency is whole blocks / the blocks one request of exactly max_model_len "
        "tokens (each --context here) reserves, a float; its KV cache size is that concurrency x "
        "max_model_len, so it depends on the context and counts reservations, not the pool"
    ]
    if shape.sliding_layers or shape.chunked_layers:
        notes.append(
            "a sliding/chunked layer reserves window - 1 + max_num_batched_tokens x batches in flight "
            "tokens (+1 block) per request in vLLM, the planner only the window"
        )
    if any(spec.kind == "state" for spec in specs):
        notes.append(
            "hybrid: vLLM raises the attention block size until a page holds one linear-attention "
            "state, pads the state to it, divides its blocks among the groups, and reserves two state "
            "pages per request with prefix caching (one without)"
        )
    kinds = {spec.kind for spec in specs}
    if len(kinds) > 1:
        notes.append(
            "mixed layer kinds: vLLM splits layers into equal-size groups (padding the last of a "
            "kind); a request reserves blocks in every group"
        )
    return notes


def build_report(
    shape: ModelShape,
    gpus_gb: Sequence[float],
    contexts: Sequence[int],
    util: float,
    overhead_gb: float,
    block_tokens: int = 1,
    bandwidth_gbs: float | None = None,
    kv_cache_gb: float | None = None,
    max_num_batched_tokens: int | None = None,
    vllm_block_size: int = VLLM_BLOCK_SIZE,
    vllm_concurrent_batches: int = VLLM_GPU_CONCURRENT_BATCHES,
    vllm_prefix_caching: bool = True,
) -> dict[str, Any]:
    """Every number the plan shows, as JSON-ready values.

    With ``kv_cache_gb`` the plan is for that fixed KV budget alone (one row, no GPU).
    """
    shape.validate()
    if kv_cache_gb is not None:
        plans = [plan_fixed_kv(shape, kv_cache_gb)]
        rows: list[float | None] = [None]
    else:
        plans = [plan_capacity(shape, gb, util, overhead_gb) for gb in gpus_gb]
        rows = list(gpus_gb)
    first = plans[0]
    specs = layer_specs(shape)
    gpus = []
    for gb, plan in zip(rows, plans, strict=True):
        batched = _vllm_batched_tokens(gb, max_num_batched_tokens)
        gpus.append(
            {
                "gpu_gb": gb,
                "kv_cache_gb": kv_cache_gb,
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
                "vllm": _vllm_cells(
                    plan, specs, contexts, vllm_block_size, batched, vllm_concurrent_batches, vllm_prefix_caching
                ),
            }
        )
    warnings = []
    if shape.context_length:
        for ctx in contexts:
            if ctx > shape.context_length:
                warnings.append(
                    f"context {ctx:,} is past the model's native length ({shape.context_length:,}): vLLM refuses "
                    "a --max-model-len above it unless told to (VLLM_ALLOW_LONG_MAX_MODEL_LEN), and quality "
                    "past it is not the model's"
                )
    assumptions = list(shape.assumptions)
    if kv_cache_gb is None:
        assumptions.append(f"runtime overhead {overhead_gb:g} GiB (activations, CUDA graphs): measure yours")
    caching = "on: two state pages per request for linear attention" if vllm_prefix_caching else "off"
    assumptions.append(
        f"vLLM view (vLLM 0.32.0's rules): block size {vllm_block_size} (--vllm-block-size), prefix caching "
        f"{caching} (--vllm-prefix-caching), {vllm_concurrent_batches} batch(es) in flight "
        "(--vllm-concurrent-batches: 2 with async scheduling on a GPU, 1 on the CPU build), "
        "max_num_batched_tokens as vllm serve defaults it unless --max-num-batched-tokens"
    )
    report: dict[str, Any] = {
        "model": shape.describe(),
        "weight_bytes": first.weight_bytes,
        "active_weight_bytes": shape.active_weight_bytes if first.weight_bytes else 0,
        "kv_bytes_per_token": first.kv_bytes_per_token,
        "kv_row_bytes": shape.kv_row_bytes if shape.attention_layers else 0,
        "seq_state_bytes": first.seq_state_bytes,
        "sequence_bytes": {str(ctx): first.sequence_bytes(ctx, block_tokens) for ctx in contexts},
        "utilization": util,
        "overhead_gb": overhead_gb,
        "block_tokens": block_tokens,
        "contexts": list(contexts),
        "kv_cache_gb": kv_cache_gb,
        "gpus": gpus,
        "vllm_differs": _difference(shape, specs),
        "assumptions": assumptions,
        "warnings": warnings,
        "decode": None,
    }
    if bandwidth_gbs is not None and first.weight_bytes:
        single = {str(ctx): decode_bound(first, bandwidth_gbs, ctx, 1).tokens_per_s for ctx in contexts}
        batches = []
        for gb, plan in zip(rows, plans, strict=True):
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
