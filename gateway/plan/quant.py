"""Weight bytes of a quantised checkpoint, from its ``quantization_config``.

Quantisation covers the linear layers; embeddings, the LM head and MoE routers stay in the model dtype
(the methods below leave them out, and vLLM loads them unquantised). Each scheme costs its bits per
weight plus its scales, per the checkpoint formats:

* ``fp8`` (DeepSeek-V3, Qwen3-FP8): 1 byte per weight, plus one fp32 scale per
  ``weight_block_size`` block (128 x 128: 4 / 16384 B per weight) when blocked;
* ``awq`` / ``gptq`` (and their Marlin variants): ``bits`` per weight, plus per ``group_size`` group an
  fp16 scale and a packed ``bits``-wide zero point (4-bit, group 128: 4 + 20/128 = 4.156 bits);
* ``compressed-tensors``: ``num_bits`` of the first config group's weights, plus a 16-bit scale (and a
  zero point when asymmetric) per group for the ``group`` strategy, per block for ``block``; per-channel
  and per-tensor scales are under 0.01 % and not counted;
* ``mxfp4`` (gpt-oss): routed experts only, 4 bits plus one 8-bit scale per 32 weights = 4.25 bits.

Any other method is refused: its size cannot be derived from the config, so ``--weights-gb`` must give it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.plan.config_reader import ConfigReader


@dataclass(frozen=True)
class WeightQuant:
    """How many bytes a quantised weight costs, and which parameter classes the scheme covers."""

    label: str  # e.g. "fp8 (block 128x128)"
    bytes_per_weight: float
    experts_only: bool = False  # mxfp4: attention and dense layers stay in the model dtype
    attention_quantised: bool = True


def _positive(reader: ConfigReader, qc: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = qc.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value == 0 or value < -1:
        raise reader.error("quantization_config", f"has {key}={value!r}: expected a positive integer (or -1)")
    return value


def _grouped(bits: int, group: int | None, scale_bytes: float, zero: bool) -> float:
    per_group = scale_bytes + (bits / 8 if zero else 0.0)
    return bits / 8 + (per_group / group if group and group > 0 else 0.0)


def read_quant(reader: ConfigReader) -> WeightQuant | None:
    """The weight quantisation a config declares (None for an unquantised checkpoint)."""
    qc = reader.mapping("quantization_config")
    if qc is None:
        return None
    method = str(qc.get("quant_method", "")).lower().replace("-", "_")
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block:
            if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
                raise reader.error(
                    "quantization_config", f"has weight_block_size={block!r}: expected two positive integers"
                )
            return WeightQuant(f"fp8 (block {block[0]}x{block[1]}, fp32 scales)", 1 + 4 / (block[0] * block[1]))
        return WeightQuant("fp8 (per-tensor scales)", 1.0)
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = _positive(reader, qc, "bits", None) or _positive(reader, qc, "w_bit", None)
        if bits is None or bits < 0:
            raise reader.error("quantization_config", f"({method}) has no bits")
        group = _positive(reader, qc, "group_size", None) or _positive(reader, qc, "q_group_size", 128)
        zero = bool(qc.get("zero_point", True))
        return WeightQuant(f"{method} {bits}-bit, group {group}", _grouped(bits, group, 2.0, zero))
    if method == "compressed_tensors":
        groups = qc.get("config_groups")
        if not isinstance(groups, Mapping) or not groups:
            raise reader.error("quantization_config", "(compressed-tensors) has no config_groups")
        first = next(iter(groups.values()))
        weights = first.get("weights") if isinstance(first, Mapping) else None
        if not isinstance(weights, Mapping):
            raise reader.error("quantization_config", "(compressed-tensors) config group has no weights scheme")
        bits = _positive(reader, weights, "num_bits", None)
        if bits is None or bits < 0:
            raise reader.error("quantization_config", "(compressed-tensors) weights have no num_bits")
        strategy = str(weights.get("strategy", "tensor"))
        symmetric = bool(weights.get("symmetric", True))
        ignore = [str(i) for i in qc.get("ignore") or []]
        attention = not any("attn" in i for i in ignore)
        kind = str(weights.get("type", "int"))
        if strategy == "group":
            group = _positive(reader, weights, "group_size", None)
            return WeightQuant(
                f"compressed-tensors {kind}{bits}, group {group}",
                _grouped(bits, group, 2.0, not symmetric),
                attention_quantised=attention,
            )
        if strategy == "block":
            block = weights.get("block_structure") or [128, 128]
            size = int(block[0]) * int(block[1])
            return WeightQuant(
                f"compressed-tensors {kind}{bits}, block {block[0]}x{block[1]}",
                bits / 8 + 2 / size,
                attention_quantised=attention,
            )
        return WeightQuant(
            f"compressed-tensors {kind}{bits}, per-{strategy} scales", bits / 8, attention_quantised=attention
        )
    if method == "mxfp4":
        return WeightQuant("mxfp4 experts (4 bits + 8-bit scale per 32)", (4 + 8 / 32) / 8, experts_only=True)
    raise reader.error(
        "quantization_config", f"quant_method {method or '(none)'!r} is not sized by the planner: pass --weights-gb"
    )
