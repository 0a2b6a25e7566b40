"""The model's shape: the handful of numbers that decide its memory footprint.

A shape comes from a GGUF file, a Hugging Face ``config.json`` or flags; flags override file values.
Every field remembers where it came from (``sources``) so the report can say which numbers were read
and which were assumed. Only what memory depends on is kept: the planner never needs hidden sizes or
vocabularies once the parameter count is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from gateway.plan.units import kv_dtype, weight_bpw


@dataclass(frozen=True)
class ModelShape:
    """Memory-relevant shape of a decoder model.

    ``kv_layers`` counts only the layers that hold a per-token KV cache: in a hybrid model (Qwen3-Next,
    Qwen3.5/3.6) the linear-attention layers hold a fixed per-sequence state instead, summed over all
    such layers in ``seq_state_bytes``. ``total_params`` decides memory (every expert of a MoE is
    resident); ``active_params`` decides the bytes read per decode step.
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
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    # -- combining ---------------------------------------------------------------------------------
    def override(self, source: str = "flag", **values: Any) -> "ModelShape":
        """Return a copy with every non-None value replaced, recording ``source`` for each.

        A weight quantisation given on its own asks for weights computed from the parameter count, so
        it drops a weight size read from a file; a weight size given explicitly always wins.
        """
        known = {f.name for f in fields(self)} - {"sources"}
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
    def kv_bytes_per_token(self) -> int:
        """K and V for one token over all KV-bearing layers: 2 x layers x KV heads x head dim x dtype bytes
        (K and V rows sized separately, so K/V head dims may differ and block types round per row)."""
        layers = self.attention_layers
        if layers == 0:
            return 0
        if self.kv_heads is None or self.head_dim is None:
            raise ValueError("model shape lacks KV heads or head dim: give --kv-heads and --head-dim, --gguf or --hf-config")
        dtype = kv_dtype(self.kv_dtype)
        head_v = self.head_dim_v if self.head_dim_v is not None else self.head_dim
        return layers * (dtype.row_bytes(self.kv_heads * self.head_dim) + dtype.row_bytes(self.kv_heads * head_v))

    @property
    def resolved_weight_bytes(self) -> int:
        """Resident weight bytes: the file size when known, else parameters x bits-per-weight."""
        if self.weight_bytes is not None:
            return int(self.weight_bytes)
        if self.total_params is not None and self.weight_quant is not None:
            return int(self.total_params * weight_bpw(self.weight_quant) / 8)
        raise ValueError(
            "cannot size the weights: give --weights-gb, a --gguf file, or --params with --weight-quant"
        )

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
            self.experts and self.experts_used and self.total_params and self.active_params
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
            "sources": dict(self.sources),
        }
