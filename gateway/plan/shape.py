"""The model's shape: the handful of numbers that decide its memory footprint.

A shape comes from a GGUF file, a Hugging Face ``config.json`` or flags; flags override file values.
Every field remembers where it came from (``sources``) so the report can say which numbers were read,
and ``assumptions`` lists what the reader had to decide without a number (a family default, a dtype
vLLM would substitute). Only what memory depends on is kept: the planner never needs hidden sizes or
vocabularies once the parameter count is known.

Attention layers come in four kinds, all sized by the same per-layer, per-token row:

* full attention: one row per token of the whole context;
* sliding-window layers (Mistral-7B-v0.1, Gemma-2/3, gpt-oss): at most ``sliding_window`` tokens;
* chunked local attention (Llama-4): at most ``attention_chunk`` tokens;
* multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): the row is one compressed latent of
  ``kv_latent_dim`` values (``kv_lora_rank + qk_rope_head_dim``) shared by all heads, not K and V per head.

Linear-attention / Mamba layers hold a fixed state per sequence instead (``seq_state_bytes``, summed
over ``state_layers`` layers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gateway.plan.units import kv_dtype, weight_bpw

MAX_LAYERS = 10_000  # published decoders have at most a few hundred; more is a typo, not a model

_FLAG_NAMES = {
    "layers": "--layers",
    "kv_layers": "--kv-layers",
    "kv_heads": "--kv-heads",
    "head_dim": "--head-dim",
    "head_dim_v": "--head-dim",
    "experts": "--experts",
    "experts_used": "--experts-used",
    "total_params": "--params",
    "active_params": "--active-params",
    "weight_bytes": "--weights-gb",
    "seq_state_bytes": "--seq-state",
    "sliding_window": "--sliding-window",
    "sliding_layers": "--sliding-layers",
    "kv_latent_dim": "--kv-latent-dim",
}


@dataclass(frozen=True)
class ModelShape:
    """Memory-relevant shape of a decoder model.

    ``kv_layers`` counts every layer that holds a per-token KV cache; ``sliding_layers`` and
    ``chunked_layers`` are the part of them whose cache is bounded by a window. In a hybrid model
    (Qwen3-Next, Qwen3.5/3.6) the linear-attention layers hold a fixed per-sequence state instead, summed
    over all such layers in ``seq_state_bytes``. ``total_params`` decides memory (every expert of a MoE
    is resident); ``active_params`` decides the bytes read per decode step.
    """

    name: str = "model"
    layers: int | None = None
    kv_layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    head_dim_v: int | None = None
    kv_dtype: str = "fp16"
    seq_state_bytes: int = 0
    total_params: float | None = None
    active_params: float | None = None
    expert_params: float | None = None
    experts: int | None = None
    experts_used: int | None = None
    weight_quant: str | None = None
    weight_bytes: int | None = None
    context_length: int | None = None
    sliding_layers: int = 0
    sliding_window: int | None = None
    chunked_layers: int = 0
    attention_chunk: int | None = None
    kv_latent_dim: int | None = None
    state_layers: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    assumptions: tuple[str, ...] = field(default=(), compare=False)

    # -- combining ---------------------------------------------------------------------------------
    def override(self, source: str = "flag", **values: Any) -> ModelShape:
        """Return a copy with every non-None value replaced, recording ``source`` for each.

        A weight quantisation given on its own asks for weights computed from the parameter count, so
        it drops a weight size read from a file; a weight size given explicitly always wins.
        """
        known = {f.name for f in fields(self)} - {"sources", "assumptions"}
        unknown = set(values) - known
        if unknown:
            raise TypeError(f"unknown shape fields: {', '.join(sorted(unknown))}")
        given = {k: v for k, v in values.items() if v is not None}
        if "weight_quant" in given and "weight_bytes" not in given:
            given["weight_bytes"] = None
        sources = dict(self.sources)
        sources.update({k: source for k in given if given[k] is not None})
        if given.get("weight_bytes", 0) is None:
            sources.pop("weight_bytes", None)
        return replace(self, sources=sources, **given)

    # -- checking ----------------------------------------------------------------------------------
    def validate(self) -> ModelShape:
        """Refuse sizes no model has, naming the field and where it came from (a file key or a flag),
        so a typo never turns into a negative capacity that reads as "fits"."""

        def where(name: str) -> str:
            source = self.sources.get(name)
            if source is None or source == "flag":
                return _FLAG_NAMES.get(name, name)
            return f"{name} (from {source})"

        positive = (
            "layers",
            "kv_heads",
            "head_dim",
            "head_dim_v",
            "experts",
            "experts_used",
            "context_length",
            "sliding_window",
            "attention_chunk",
            "kv_latent_dim",
        )
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{where(name)} must be positive, got {value}")
        for name in ("kv_layers", "seq_state_bytes", "sliding_layers", "chunked_layers", "state_layers"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{where(name)} must not be negative, got {value}")
        for name in ("total_params", "active_params", "expert_params", "weight_bytes"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"{where(name)} must be a positive finite number, got {value}")
        for name in ("layers", "kv_layers"):
            value = getattr(self, name)
            if value is not None and value > MAX_LAYERS:
                raise ValueError(f"{where(name)} must be at most {MAX_LAYERS:,}, got {value:,}")
        if self.layers is not None and self.kv_layers is not None and self.kv_layers > self.layers:
            raise ValueError(f"{where('kv_layers')} ({self.kv_layers}) exceeds {where('layers')} ({self.layers})")
        if self.sliding_layers + self.chunked_layers > (
            self.kv_layers if self.kv_layers is not None else self.layers or 0
        ):
            raise ValueError(f"{where('sliding_layers')} ({self.sliding_layers}) exceeds the KV layers")
        if self.sliding_layers and self.sliding_window is None:
            raise ValueError(f"{where('sliding_layers')} given without a sliding window (--sliding-window)")
        if self.chunked_layers and self.attention_chunk is None:
            raise ValueError(f"{where('chunked_layers')} given without an attention chunk size")
        if self.experts and self.experts_used and self.experts_used > self.experts:
            raise ValueError(
                f"{where('experts_used')} ({self.experts_used}) exceeds {where('experts')} ({self.experts})"
            )
        if self.total_params and self.active_params and self.active_params > self.total_params * 1.0001:
            raise ValueError(f"{where('active_params')} exceeds {where('total_params')}")
        return self

    # -- derived -----------------------------------------------------------------------------------
    @property
    def attention_layers(self) -> int:
        """KV-bearing layers; a shape without a hybrid split has KV in every layer."""
        if self.kv_layers is not None:
            return self.kv_layers
        if self.layers is None:
            raise ValueError("model shape has no layer count: give --layers (or --kv-layers), --gguf or --hf-config")
        return self.layers

    @property
    def kv_row_bytes(self) -> int:
        """One token's cache in one KV layer: K and V rows sized separately (K/V head dims may differ,
        block dtypes round per row), or for MLA the single latent row."""
        dtype = kv_dtype(self.kv_dtype)
        if self.kv_latent_dim is not None:
            return dtype.row_bytes(self.kv_latent_dim)
        if self.kv_heads is None or self.head_dim is None:
            raise ValueError(
                "model shape lacks KV heads or head dim: give --kv-heads and --head-dim, --gguf or --hf-config"
            )
        head_v = self.head_dim_v if self.head_dim_v is not None else self.head_dim
        return dtype.row_bytes(self.kv_heads * self.head_dim) + dtype.row_bytes(self.kv_heads * head_v)

    @property
    def kv_bytes_per_token(self) -> int:
        """One token's cache over every KV-bearing layer (a token still inside every window):
        KV layers x (2 x KV heads x head dim, or the MLA latent) x dtype bytes."""
        layers = self.attention_layers
        if layers == 0:
            return 0
        return layers * self.kv_row_bytes

    @property
    def full_layers(self) -> int:
        """KV layers that keep the whole context (neither sliding nor chunked)."""
        return self.attention_layers - self.sliding_layers - self.chunked_layers

    def sequence_kv_bytes(self, context_tokens: int, block_tokens: int = 1) -> int:
        """KV one sequence of ``context_tokens`` holds: full layers keep every token, a sliding layer
        at most its window, a chunked layer at most its chunk; each rounded up to whole blocks."""
        if self.attention_layers == 0:
            return 0

        def blocks(tokens: int) -> int:
            return math.ceil(tokens / block_tokens) * block_tokens

        tokens = self.full_layers * blocks(context_tokens)
        if self.sliding_layers:
            assert self.sliding_window is not None
            tokens += self.sliding_layers * blocks(min(context_tokens, self.sliding_window))
        if self.chunked_layers:
            assert self.attention_chunk is not None
            tokens += self.chunked_layers * blocks(min(context_tokens, self.attention_chunk))
        return tokens * self.kv_row_bytes

    @property
    def state_layer_count(self) -> int:
        """Layers holding a per-sequence state: as read, else every non-KV layer, else one."""
        if not self.seq_state_bytes:
            return 0
        if self.state_layers:
            return self.state_layers
        if self.layers is not None and self.layers > self.attention_layers:
            return self.layers - self.attention_layers
        return 1

    @property
    def resolved_weight_bytes(self) -> int:
        """Resident weight bytes: the file size when known, else parameters x bits-per-weight."""
        if self.weight_bytes is not None:
            return int(self.weight_bytes)
        if self.total_params is not None and self.weight_quant is not None:
            return int(self.total_params * weight_bpw(self.weight_quant) / 8)
        raise ValueError("cannot size the weights: give --weights-gb, a --gguf file, or --params with --weight-quant")

    @property
    def active_fraction(self) -> float:
        """Share of the weights read per token (1.0 for a dense model)."""
        if self.total_params and self.active_params:
            return min(1.0, self.active_params / self.total_params)
        return 1.0

    @property
    def active_weight_bytes(self) -> int:
        """Weight bytes one decode step must read for one token: the shared part plus the routed experts."""
        return int(self.resolved_weight_bytes * self.active_fraction)

    @property
    def expert_fraction(self) -> float | None:
        """Share of the weights held by routed experts, when known (for the batch read estimate)."""
        if self.expert_params is not None and self.total_params:
            return min(1.0, self.expert_params / self.total_params)
        if (
            self.experts
            and self.experts_used
            and self.total_params
            and self.active_params
            and self.experts > self.experts_used
        ):
            # total = shared + E*e, active = shared + k*e  =>  E*e = (total - active) * E / (E - k)
            expert = (self.total_params - self.active_params) * self.experts / (self.experts - self.experts_used)
            return min(1.0, max(0.0, expert / self.total_params))
        return None

    def describe(self) -> dict[str, Any]:
        """Plain values for the report and JSON output."""
        return {
            "name": self.name,
            "layers": self.layers,
            "kv_layers": self.attention_layers if (self.kv_layers is not None or self.layers is not None) else None,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "head_dim_v": self.head_dim_v if self.head_dim_v is not None else self.head_dim,
            "kv_dtype": self.kv_dtype,
            "total_params": self.total_params,
            "active_params": self.active_params,
            "experts": self.experts,
            "experts_used": self.experts_used,
            "weight_quant": self.weight_quant,
            "context_length": self.context_length,
            "sliding_layers": self.sliding_layers,
            "sliding_window": self.sliding_window,
            "chunked_layers": self.chunked_layers,
            "attention_chunk": self.attention_chunk,
            "kv_latent_dim": self.kv_latent_dim,
            "state_layers": self.state_layer_count,
            "sources": dict(self.sources),
            "assumptions": list(self.assumptions),
        }
