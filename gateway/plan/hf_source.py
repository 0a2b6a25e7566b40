"""Read a model's shape from a Hugging Face ``config.json``.

A config has no weights, so the parameter count is estimated from the dimensions, for the decoder
families whose layout is standard (Llama/Mistral/Qwen2/Qwen3 dense, Mixtral/Qwen3-MoE, and the hybrid
Qwen3-Next/Qwen3.5/Qwen3.6 with gated DeltaNet layers): embeddings, attention projections, SwiGLU
MLPs or routed + shared experts, and the linear-attention projections. Norms and biases are ignored
(well under 0.1 %). The estimate matches published totals (Llama-3-8B 8.03B, Mixtral-8x7B 46.7B /
12.9B active, Qwen3-30B-A3B 30.5B / 3.3B); pass --params to override it for anything exotic.

Multimodal checkpoints (Qwen3.5/3.6) keep the language model under ``text_config``; it is used when
present. The linear-attention state per sequence follows vLLM's layout: a recurrent state of
``value_heads x key_head_dim x value_head_dim`` in ``mamba_ssm_dtype`` (else the model dtype) and a
convolution state of ``(conv_kernel - 1) x (2 x key_heads x key_head_dim + value_heads x value_head_dim)``
in the model dtype.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from gateway.plan.shape import ModelShape
from gateway.plan.units import TORCH_DTYPE_BYTES, TORCH_DTYPES

KV_LAYER_TYPES = {"full_attention", "attention", "sliding_attention", "global_attention"}
LINEAR_LAYER_TYPES = {"linear_attention", "mamba", "mamba2", "gated_deltanet", "recurrent"}


def _text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(cfg)
    text = cfg.get("text_config")
    if isinstance(text, Mapping):
        merged.update(text)
    return merged


def _dtype(cfg: Mapping[str, Any]) -> str:
    raw = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return TORCH_DTYPES.get(raw, "bf16")


def _layer_split(cfg: Mapping[str, Any], layers: int) -> tuple[int, int, str]:
    """(KV-bearing layers, linear-attention layers, where the split came from)."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        types = types[:layers]
        kv = sum(1 for t in types if t in KV_LAYER_TYPES)
        linear = sum(1 for t in types if t in LINEAR_LAYER_TYPES)
        unknown = set(types) - KV_LAYER_TYPES - LINEAR_LAYER_TYPES
        if unknown:
            raise ValueError(f"config.json layer_types has kinds the planner does not know: {sorted(unknown)}")
        return kv, linear, "config.layer_types"
    interval = cfg.get("full_attention_interval")
    if interval:
        kv = sum(1 for i in range(layers) if (i + 1) % int(interval) == 0)
        return kv, layers - kv, f"config.full_attention_interval={interval}"
    return layers, 0, "config.num_hidden_layers"


def _linear_state_bytes(cfg: Mapping[str, Any], model_bytes: int) -> int:
    """Per-sequence state of one gated-DeltaNet layer (0 when the config has none)."""
    v_heads = cfg.get("linear_num_value_heads")
    if not v_heads:
        return 0
    k_heads = int(cfg.get("linear_num_key_heads") or v_heads)
    k_dim = int(cfg.get("linear_key_head_dim") or 128)
    v_dim = int(cfg.get("linear_value_head_dim") or k_dim)
    kernel = int(cfg.get("linear_conv_kernel_dim") or 4)
    ssm_name = TORCH_DTYPES.get(str(cfg.get("mamba_ssm_dtype") or ""), None)
    ssm_bytes = TORCH_DTYPE_BYTES[ssm_name] if ssm_name else model_bytes
    recurrent = int(v_heads) * k_dim * v_dim * ssm_bytes
    conv = (kernel - 1) * (2 * k_heads * k_dim + int(v_heads) * v_dim) * model_bytes
    return recurrent + conv


def estimate_params(cfg: Mapping[str, Any]) -> tuple[float, float, float]:
    """(total, active, routed-expert) parameter estimate from a (text) config's dimensions."""
    cfg = _text_config(cfg)
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    vocab = int(cfg.get("vocab_size") or 0)
    tied = bool(cfg.get("tie_word_embeddings", False))
    embeddings = vocab * hidden * (1 if tied else 2)

    kv_layers, linear_layers, _ = _layer_split(cfg, layers)
    gated_q = 2 if (cfg.get("attn_output_gate") or cfg.get("model_type", "").startswith("qwen3_next")) else 1
    attention = hidden * heads * head_dim * gated_q + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    linear = 0
    if linear_layers and cfg.get("linear_num_value_heads"):
        v_heads = int(cfg["linear_num_value_heads"])
        k_heads = int(cfg.get("linear_num_key_heads") or v_heads)
        k_dim = int(cfg.get("linear_key_head_dim") or 128)
        v_dim = int(cfg.get("linear_value_head_dim") or k_dim)
        key_total, value_total = k_heads * k_dim, v_heads * v_dim
        kernel = int(cfg.get("linear_conv_kernel_dim") or 4)
        linear = (
            hidden * (2 * key_total + 2 * value_total)  # q, k, v and the output gate z
            + hidden * 2 * v_heads  # per-head beta and decay
            + (2 * key_total + value_total) * kernel  # depthwise convolution
            + value_total * hidden  # output projection
        )

    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    used = int(cfg.get("num_experts_per_tok") or 0)
    dense_mlp = 3 * hidden * int(cfg.get("intermediate_size") or 0)
    moe_layers = 0
    if experts:
        sparse_step = int(cfg.get("decoder_sparse_step") or 1)
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        moe_layers = sum(1 for i in range(layers) if i not in mlp_only and (i + 1) % sparse_step == 0)
    expert_size = 3 * hidden * int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    shared = 3 * hidden * int(cfg.get("shared_expert_intermediate_size") or 0)
    router = hidden * experts
    routed = moe_layers * experts * expert_size

    total = (
        embeddings
        + kv_layers * attention
        + linear_layers * linear
        + (layers - moe_layers) * dense_mlp
        + moe_layers * (shared + router)
        + routed
    )
    active = total - routed + (moe_layers * used * expert_size if experts else 0)
    return float(total), float(active), float(routed)


def shape_from_hf_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> ModelShape:
    """Build a ``ModelShape`` from a config.json path or an already-parsed dict."""
    if isinstance(source, Mapping):
        raw, name = source, str(source.get("_name_or_path") or source.get("model_type") or "model")
    else:
        path = Path(source)
        raw = json.loads(path.read_text())
        name = str(raw.get("_name_or_path") or path.parent.name or raw.get("model_type") or "model")
    cfg = _text_config(raw)
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
    except KeyError as exc:
        raise ValueError(f"config.json lacks {exc.args[0]}: is this a decoder LLM config?") from None
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    dtype = _dtype(cfg)
    kv_layers, linear_layers, split_source = _layer_split(cfg, layers)
    state = linear_layers * _linear_state_bytes(cfg, TORCH_DTYPE_BYTES[dtype])

    sources = {
        "layers": "config.num_hidden_layers",
        "kv_layers": split_source,
        "kv_heads": "config.num_key_value_heads",
        "head_dim": "config.head_dim" if cfg.get("head_dim") else "config.hidden_size / num_attention_heads",
        "weight_quant": "config.torch_dtype",
        "kv_dtype": "config.torch_dtype",
    }
    if state:
        sources["seq_state_bytes"] = f"config.linear_* x {linear_layers} linear layers"
    total = active = routed = None
    try:
        total, active, routed = estimate_params(cfg)
        sources["total_params"] = sources["active_params"] = "estimated from config dimensions"
    except (KeyError, ValueError, TypeError):
        pass  # exotic layout: the user must pass --params
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    context = cfg.get("max_position_embeddings")
    return ModelShape(
        name=name,
        layers=layers,
        kv_layers=kv_layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        kv_dtype=dtype,
        seq_state_bytes=state,
        total_params=total,
        active_params=active,
        expert_params=routed or None,
        experts=int(experts) if experts else None,
        experts_used=int(cfg["num_experts_per_tok"]) if experts and cfg.get("num_experts_per_tok") else None,
        weight_quant=dtype,
        context_length=int(context) if context else None,
        sources=sources,
    )
