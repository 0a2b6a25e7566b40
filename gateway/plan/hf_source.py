"""Read a model's shape from a Hugging Face ``config.json``, the way vLLM will serve it.

The pieces each have their module: ``config_reader`` (checked reads, errors naming file and field),
``layout`` (which layers are full, sliding, chunked or linear attention), ``hf_params`` (parameters per
class) and ``quant`` (bytes per quantised weight). This module puts them together and records every
decision the config did not spell out in ``ModelShape.assumptions``:

* the dtype vLLM serves: ``--dtype auto`` runs a float32 checkpoint in 16 bits, so an fp32 config is
  planned at bf16 (weights and KV cache);
* MLA (``kv_lora_rank``): the cache is one latent of ``kv_lora_rank + qk_rope_head_dim`` per token per
  layer, shared by every head (vLLM's MLAAttentionSpec: one "KV head" of that size, no separate V);
* multi-token-prediction layers (``num_nextn_predict_layers``) are not loaded without speculative
  decoding, so they count neither in weights nor in cache;
* tied embeddings by the family's default when the key is absent;
* multimodal checkpoints: the language model under ``text_config`` is planned; a vision tower is not
  counted (add it with --weights-gb when it matters).

The linear-attention state per sequence follows vLLM's layout: a recurrent state of
``value_heads x key_head_dim x value_head_dim`` in ``mamba_ssm_dtype`` (else the model dtype) and a
convolution state of ``(conv_kernel - 1) x (2 x key_heads x key_head_dim + value_heads x value_head_dim)``
in the model dtype.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.plan.config_reader import ConfigError, ConfigReader
from gateway.plan.hf_params import ParamCounts, count_params, experts_of, tied_embeddings
from gateway.plan.layout import Layout, read_layout
from gateway.plan.quant import WeightQuant, read_quant
from gateway.plan.shape import MAX_LAYERS, ModelShape
from gateway.plan.units import TORCH_DTYPE_BYTES, TORCH_DTYPES


def _served_dtype(reader: ConfigReader) -> tuple[str, str | None]:
    """(our dtype name, the assumption made): what vLLM's ``--dtype auto`` runs."""
    raw = reader.get("torch_dtype") or reader.get("dtype")
    if raw is None:
        return "bf16", "torch_dtype absent: assumed bfloat16"
    name = TORCH_DTYPES.get(str(raw).replace("torch.", ""))
    if name is None:
        raise reader.error("torch_dtype", f"{raw!r} is not a dtype the planner knows")
    if name == "fp32":
        return "bf16", "torch_dtype float32: vLLM (--dtype auto) serves it in 16 bits, planned as bf16"
    return name, None


def _linear_state_bytes(reader: ConfigReader, model_bytes: int) -> int:
    """Per-sequence state of one gated-DeltaNet layer (0 when the config has none)."""
    v_heads = reader.opt_int("linear_num_value_heads")
    if not v_heads:
        return 0
    k_heads = reader.opt_int("linear_num_key_heads", v_heads) or v_heads
    k_dim = reader.opt_int("linear_key_head_dim", 128) or 128
    v_dim = reader.opt_int("linear_value_head_dim", k_dim) or k_dim
    kernel = reader.opt_int("linear_conv_kernel_dim", 4) or 4
    ssm_name = TORCH_DTYPES.get(str(reader.get("mamba_ssm_dtype", "")))
    ssm_bytes = TORCH_DTYPE_BYTES[ssm_name] if ssm_name else model_bytes
    recurrent = v_heads * k_dim * v_dim * ssm_bytes
    conv = (kernel - 1) * (2 * k_heads * k_dim + v_heads * v_dim) * model_bytes
    return recurrent + conv


def _attention_dims(reader: ConfigReader) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim), checked: KV heads must divide the query heads."""
    heads = reader.require_int("num_attention_heads")
    kv_heads = reader.opt_int("num_key_value_heads", heads)
    assert kv_heads is not None
    if heads % kv_heads:
        raise reader.error("num_key_value_heads", f"({kv_heads}) does not divide num_attention_heads ({heads})")
    head_dim = reader.opt_int("head_dim")
    if head_dim is None:
        hidden = reader.require_int("hidden_size")
        if hidden % heads:
            raise reader.error(
                "hidden_size", f"({hidden}) is not a multiple of num_attention_heads ({heads}); give head_dim"
            )
        head_dim = hidden // heads
    return heads, kv_heads, head_dim


def _weight_bytes(counts: ParamCounts, quant: WeightQuant, model_bytes: int) -> int:
    """Quantised classes at the scheme's bytes per weight, the rest (embeddings, LM head, routers,
    and for an experts-only scheme everything but the routed experts) at the model dtype."""
    if quant.experts_only:
        quantised = counts.routed
    else:
        quantised = counts.dense_mlp + counts.shared_experts + counts.routed + counts.linear_attention
        if quant.attention_quantised:
            quantised += counts.attention
    rest = counts.total - quantised
    return int(quantised * quant.bytes_per_weight + rest * model_bytes)


def estimate_params(cfg: Mapping[str, Any]) -> tuple[float, float, float]:
    """(total, active, routed-expert) parameter estimate from a (text) config's dimensions."""
    reader = ConfigReader(cfg, "config.json")
    layers = reader.require_int("num_hidden_layers", maximum=MAX_LAYERS)
    heads, kv_heads, head_dim = _attention_dims(reader)
    counts = count_params(reader, read_layout(reader, layers), heads, kv_heads, head_dim)
    return counts.total, counts.active, counts.routed


def shape_from_hf_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> ModelShape:
    """Build a ``ModelShape`` from a config.json path or an already-parsed dict.

    Raises ``ConfigError`` (a ``ValueError``) with one line naming the file and the field.
    """
    if isinstance(source, Mapping):
        reader = ConfigReader(source, "config.json")
        name = str(source.get("_name_or_path") or source.get("model_type") or "model")
    else:
        path = Path(source)
        reader = ConfigReader.from_file(path)
        name = str(reader.raw.get("_name_or_path") or path.parent.name or reader.raw.get("model_type") or "model")
    return _shape(reader, name)


def _shape(reader: ConfigReader, name: str) -> ModelShape:
    layers = reader.require_int("num_hidden_layers", maximum=MAX_LAYERS)
    heads, kv_heads, head_dim = _attention_dims(reader)
    layout: Layout = read_layout(reader, layers)
    dtype, dtype_note = _served_dtype(reader)
    model_bytes = TORCH_DTYPE_BYTES[dtype]
    assumptions: list[str] = [a for a in (dtype_note,) if a] + list(layout.assumptions)
    state_layers = layout.count("state")
    state = state_layers * _linear_state_bytes(reader, model_bytes)
    if state_layers and not state:
        raise reader.error("linear_num_value_heads", "is missing, but the layout has linear-attention layers")

    sources = {
        "layers": "config.num_hidden_layers",
        "kv_layers": layout.source,
        "kv_heads": "config.num_key_value_heads" if reader.has("num_key_value_heads") else "config.num_attention_heads",
        "head_dim": "config.head_dim" if reader.has("head_dim") else "config.hidden_size / num_attention_heads",
        "weight_quant": "config.torch_dtype",
        "kv_dtype": "config.torch_dtype (vLLM --kv-cache-dtype auto)",
    }
    latent = None
    if reader.has("kv_lora_rank"):
        latent = reader.require_int("kv_lora_rank") + reader.require_int("qk_rope_head_dim")
        sources["kv_latent_dim"] = "config.kv_lora_rank + qk_rope_head_dim (MLA)"
        assumptions.append(f"MLA: one latent of {latent} values per token per layer, shared by all heads")
    if reader.opt_int("num_nextn_predict_layers", 0, minimum=0):
        assumptions.append("num_nextn_predict_layers: the MTP layers are not loaded (no speculative decoding)")
    if layout.sliding_window is not None:
        sources["sliding_window"] = "config.sliding_window"
    if state:
        sources["seq_state_bytes"] = f"config.linear_* x {state_layers} linear layers (vLLM layout)"
    if "text_config" in reader.raw:
        assumptions.append(
            "multimodal checkpoint: the language model (text_config) only; a vision tower is not counted"
        )

    experts, used = experts_of(reader)
    _, tie_note = tied_embeddings(reader)  # count_params reads the tying itself
    if tie_note:
        assumptions.append(tie_note)
    try:
        counts: ParamCounts | None = count_params(reader, layout, heads, kv_heads, head_dim)
    except ConfigError as exc:
        if reader.has("quantization_config"):
            raise  # a quantised size cannot come from --params alone
        counts = None  # no hidden/intermediate sizes: the user must pass --params
        assumptions.append(f"parameters not estimated ({exc}): give --params or --weights-gb")
    weight_bytes = None
    weight_quant = dtype
    quant = read_quant(reader)
    if quant is not None and counts is not None:
        weight_bytes = _weight_bytes(counts, quant, model_bytes)
        weight_quant = quant.label
        sources["weight_quant"] = "config.quantization_config"
        sources["weight_bytes"] = "estimated: parameters per class x quantization_config"
        assumptions.append(f"weights: {quant.label}; embeddings, LM head and routers in {dtype}")
    if counts is not None:
        sources["total_params"] = sources["active_params"] = "estimated from config dimensions"

    context = reader.opt_int("max_position_embeddings")
    return ModelShape(
        name=name,
        layers=layers,
        kv_layers=layout.kv_layers,
        kv_heads=kv_heads if latent is None else 1,
        head_dim=head_dim if latent is None else latent,
        kv_dtype=dtype,
        seq_state_bytes=state,
        total_params=counts.total if counts else None,
        active_params=counts.active if counts else None,
        expert_params=(counts.routed or None) if counts else None,
        experts=experts or None,
        experts_used=used or None,
        weight_quant=weight_quant,
        weight_bytes=weight_bytes,
        context_length=context,
        sliding_layers=layout.count("sliding"),
        sliding_window=layout.sliding_window,
        chunked_layers=layout.count("chunked"),
        attention_chunk=layout.attention_chunk,
        kv_latent_dim=latent,
        state_layers=state_layers or None,
        sources=sources,
        assumptions=tuple(assumptions),
    ).validate()
