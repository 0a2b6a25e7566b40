"""Units and data-type tables shared by the planner.

Memory is counted in binary units (GiB = 2**30 bytes) because that is what ``nvidia-smi``, vLLM and
llama.cpp report, and a "24 GB" card is a 24 GiB card. Bandwidth is counted in decimal GB/s (1e9 bytes/s)
because that is how vendors publish it. Keeping both conventions in one module means no other module
guesses which one a number is in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

GIB = 2**30
MIB = 2**20
KIB = 2**10
GB_PER_S = 1e9
MAX_CONTEXT_TOKENS = 2**24  # 16M: past every published context (Llama-4 Scout's 10M is the longest)


@dataclass(frozen=True)
class BlockDType:
    """A storage type as llama.cpp/vLLM lay it out: ``block_bytes`` bytes hold ``block_elems`` values.

    Block types (q8_0, q4_0) carry a scale per block, so their true size is not bits/8: q8_0 stores 32
    values in 34 bytes. Rounding a row up to whole blocks is what the engines do.
    """

    block_elems: int
    block_bytes: int

    def row_bytes(self, elems: int) -> int:
        return math.ceil(elems / self.block_elems) * self.block_bytes


# KV-cache element types (vLLM --kv-cache-dtype, llama.cpp --cache-type-k/-v).
KV_DTYPES: dict[str, BlockDType] = {
    "fp32": BlockDType(1, 4),
    "fp16": BlockDType(1, 2),
    "bf16": BlockDType(1, 2),
    "fp8": BlockDType(1, 1),
    "fp8_e4m3": BlockDType(1, 1),
    "fp8_e5m2": BlockDType(1, 1),
    "q8_0": BlockDType(32, 34),
    "q5_1": BlockDType(32, 24),
    "q5_0": BlockDType(32, 22),
    "q4_1": BlockDType(32, 20),
    "q4_0": BlockDType(32, 18),
    "iq4_nl": BlockDType(32, 18),
}

# Average bits per weight of a whole quantised model. Block formats are exact (q8_0: 34 bytes / 32
# weights = 8.5 bpw; q4_0: 18 / 32 = 4.5); k-quant "mixes" keep some tensors at higher precision, so the
# figures are whole-file averages as llama.cpp's quantize tool reports them for Llama-class models
# (Q4_K_M ~4.89 bpw). A real file size (--weights-gb, or the GGUF itself) always beats this table.
WEIGHT_BPW: dict[str, float] = {
    "fp32": 32.0,
    "fp16": 16.0,
    "bf16": 16.0,
    "fp8": 8.0,
    "int8": 8.0,
    "q8_0": 8.5,
    "q6_k": 6.5625,
    "q5_k_m": 5.69,
    "q5_0": 5.5,
    "q4_k_m": 4.89,
    "q4_k_s": 4.67,
    "q4_1": 5.0,
    "q4_0": 4.5,
    "iq4_xs": 4.25,
    "mxfp4": 4.25,
    "int4": 4.25,  # AWQ/GPTQ with group size 128: 4 bits + per-group scale and zero
    "q3_k_m": 3.91,
    "q2_k": 2.96,
}

# torch dtype names found in config.json (torch_dtype / dtype) -> our names.
TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "half": "fp16", "float": "fp32"}
TORCH_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def _norm_key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def kv_dtype(name: str) -> BlockDType:
    key = _norm_key(name)
    if key not in KV_DTYPES:
        raise ValueError(f"unknown KV cache dtype {name!r}; known: {', '.join(KV_DTYPES)}")
    return KV_DTYPES[key]


def weight_bpw(name: str) -> float:
    key = _norm_key(name)
    if key not in WEIGHT_BPW:
        raise ValueError(f"unknown weight quantisation {name!r}; known: {', '.join(WEIGHT_BPW)}")
    return WEIGHT_BPW[key]


_SUFFIX = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_COUNT_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_TOKEN_SCALE = {"": 1, "k": 1024}
_BYTE_SCALE = {
    "": 1,
    "b": 1,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    # Memory sizes are binary throughout the planner: "22GB" means 22 GiB (see the module docstring).
    "k": KIB,
    "kb": KIB,
    "m": MIB,
    "mb": MIB,
    "g": GIB,
    "gb": GIB,
}


def _parse(text: str, scales: Mapping[str, float], what: str) -> float:
    match = _SUFFIX.match(str(text))
    if not match or match.group(2).lower() not in scales:
        raise ValueError(f"cannot read {text!r} as {what} (suffixes: {', '.join(s for s in scales if s)})")
    return float(match.group(1)) * scales[match.group(2).lower()]


def parse_count(text: str) -> float:
    """Parameter counts: ``35B``, ``3.3b``, ``800M``, ``8.03e9``."""
    return _parse(text, _COUNT_SCALE, "a parameter count")


def parse_tokens(text: str) -> int:
    """Context lengths: ``4K`` is 4096 tokens (as every engine means it), ``32k``, ``3000``."""
    value = _parse(text, _TOKEN_SCALE, "a token count")
    if value <= 0 or value != int(value):
        raise ValueError(f"a token count must be a positive whole number, got {text!r}")
    if value > MAX_CONTEXT_TOKENS:
        raise ValueError(f"context {text!r} is beyond any model's ({MAX_CONTEXT_TOKENS:,} tokens at most)")
    return int(value)


def parse_int(text: str, flag: str, minimum: int = 1) -> int:
    """A whole number of at least ``minimum`` for ``flag``, refused with the flag's name otherwise."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{flag}: cannot read {text!r} as a whole number") from None
    if value < minimum:
        raise ValueError(f"{flag} must be >= {minimum}, got {value}")
    return value


def parse_finite(text: str, flag: str, minimum: float = 0.0, inclusive: bool = False) -> float:
    """A finite number above ``minimum`` (or equal, when ``inclusive``) for ``flag``: ``inf``/``nan``
    and out-of-range values are refused with the flag's name."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag}: cannot read {text!r} as a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag} must be a finite number, got {text!r}")
    if value < minimum or (value == minimum and not inclusive):
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        raise ValueError(f"{flag} must be {bound}, got {text!r}")
    return value


def parse_bytes(text: str) -> int:
    """Sizes: ``62.8125MiB``, ``1.5GiB``, ``65863680``; GB/MB are read as GiB/MiB."""
    return round(_parse(text, _BYTE_SCALE, "a size in bytes"))


def split_list(values: list[str] | None) -> list[str]:
    """``["16,24", "32"]`` -> ``["16", "24", "32"]``: a repeated option or a comma list both work."""
    out: list[str] = []
    for value in values or []:
        out.extend(part.strip() for part in value.split(",") if part.strip())
    return out
