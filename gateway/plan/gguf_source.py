"""Read a model's shape from a local GGUF file's metadata and tensor table.

Nothing is loaded: ``gguf.GGUFReader`` memory-maps the file and we only read the key/value header and
the tensor shapes. The weight size is the file size (what llama.cpp maps into memory); the parameter
counts come from the tensor shapes, splitting routed-expert tensors (``*_exps``) from the rest so the
active parameter count is exact for a MoE.

Hybrid models (Qwen3-Next / Qwen3.5 / Qwen3.6) mark which layers hold a KV cache with
``<arch>.full_attention_interval`` (llama.cpp: layer i is full attention when (i+1) % interval == 0) or
with a per-layer ``head_count_kv`` array whose zeros are recurrent layers. The recurrent layers' state
follows llama.cpp's sizes (float32 by default):

    conv state  (r) = (ssm.conv_kernel - 1) x (ssm.inner_size + 2 x ssm.group_count x ssm.state_size)
    recurrent   (s) = ssm.state_size x ssm.inner_size

MLA models (``deepseek2``, Kimi-K2) carry ``attention.kv_lora_rank``: the cache is one latent of
``kv_lora_rank + rope.dimension_count`` per token per layer. Sliding-window models carry
``attention.sliding_window``; which layers slide is a per-layer ``attention.sliding_window_pattern``
array when the file has one, else llama.cpp's fixed pattern for the architecture (Gemma-2 and gpt-oss:
every other layer starting with the first; Gemma-3: five of every six; Cohere2: three of every four).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gateway.plan.shape import ModelShape

# llama.cpp's SWA pattern per architecture: layer i slides when i % n < n - 1
SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2, "cohere2": 4}
LLAMA_CPP_STATE_BYTES = 4  # llama.cpp keeps recurrent (r, s) states in float32 unless told otherwise
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<idx>\d{5})-of-(?P<n>\d{5})\.gguf$")


def _value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    if hasattr(value, "tolist"):
        value = value.tolist()
    return value


def _file_bytes(path: Path) -> int:
    """Size of the model; a split GGUF (``-00001-of-00003.gguf``) counts all its parts."""
    match = _SPLIT.match(path.name)
    if not match:
        return os.path.getsize(path)
    total = 0
    count = int(match.group("n"))
    for i in range(1, count + 1):
        part = path.with_name(f"{match.group('stem')}-{i:05d}-of-{count:05d}.gguf")
        if not part.exists():
            raise FileNotFoundError(f"split GGUF part missing: {part}")
        total += os.path.getsize(part)
    return total


def shape_from_gguf(path: str | os.PathLike[str]) -> ModelShape:
    """Build a ``ModelShape`` from the GGUF at ``path`` (raises ``ValueError`` on missing essentials)."""
    from gguf import GGUFReader  # heavy import (numpy memmap), only when a GGUF is given

    file = Path(path)
    reader = GGUFReader(file)
    arch = _value(reader, "general.architecture")
    if not arch:
        raise ValueError(f"{file}: no general.architecture in GGUF metadata")
    get = lambda key: _value(reader, f"{arch}.{key}")  # noqa: E731
    src = f"gguf:{arch}"
    sources: dict[str, str] = {}

    block_count = get("block_count")
    if block_count is None:
        raise ValueError(f"{file}: no {arch}.block_count in GGUF metadata")
    layers = int(block_count) - int(get("nextn_predict_layers") or 0)  # MTP heads hold no serving cache
    sources["layers"] = f"{src}.block_count"

    head_count = get("attention.head_count")
    head_count_kv = get("attention.head_count_kv")
    if isinstance(head_count, list):
        head_count = max(head_count)
    kv_per_layer: list[int] | None = None
    kv_heads: int | None
    if isinstance(head_count_kv, list):
        kv_per_layer = [int(h) for h in head_count_kv[:layers]]
        nonzero = [h for h in kv_per_layer if h > 0]
        kv_heads = max(nonzero) if nonzero else 0  # conservative if layers differ
    else:
        kv_heads = int(head_count_kv) if head_count_kv is not None else (int(head_count) if head_count else None)
    sources["kv_heads"] = f"{src}.attention.head_count_kv"

    key_length = get("attention.key_length")
    value_length = get("attention.value_length")
    embedding = get("embedding_length")
    if key_length is None and embedding and head_count:
        key_length = int(embedding) // int(head_count)
        sources["head_dim"] = f"{src}.embedding_length / head_count"
    else:
        sources["head_dim"] = f"{src}.attention.key_length"
    head_dim = int(key_length) if key_length is not None else None
    head_dim_v = int(value_length) if value_length is not None else head_dim

    interval = get("full_attention_interval")
    ssm_inner = get("ssm.inner_size")
    if interval:
        kv_layers = sum(1 for i in range(layers) if (i + 1) % int(interval) == 0)
        sources["kv_layers"] = f"{src}.full_attention_interval={interval}"
    elif kv_per_layer is not None:
        kv_layers = sum(1 for h in kv_per_layer if h > 0)
        sources["kv_layers"] = f"{src}.attention.head_count_kv (non-zero layers)"
    elif ssm_inner and not head_count_kv:
        kv_layers = 0  # a pure recurrent model (Mamba): no per-token cache at all
        sources["kv_layers"] = f"{src}: recurrent model"
    else:
        kv_layers = layers
        sources["kv_layers"] = f"{src}.block_count"

    seq_state = 0
    if ssm_inner:
        conv = int(get("ssm.conv_kernel") or 0)
        inner = int(ssm_inner)
        state = int(get("ssm.state_size") or 0)
        groups = int(get("ssm.group_count") or 0)
        conv_elems = max(conv - 1, 0) * (inner + 2 * groups * state)
        seq_state = (layers - kv_layers) * (conv_elems + state * inner) * LLAMA_CPP_STATE_BYTES
        sources["seq_state_bytes"] = f"{src}.ssm.* x {layers - kv_layers} recurrent layers, float32"

    experts = get("expert_count")
    experts_used = get("expert_used_count")
    total = expert = 0
    for tensor in reader.tensors:
        n = int(tensor.n_elements)
        total += n
        if "_exps" in tensor.name:
            expert += n
    active = float(total)
    if experts and experts_used and expert:
        active = total - expert + expert * int(experts_used) / int(experts)
    sources["total_params"] = "gguf tensor shapes"
    sources["active_params"] = "gguf tensor shapes (experts x used/count)" if expert else "gguf tensor shapes"
    sources["weight_bytes"] = "gguf file size"

    assumptions: list[str] = []
    latent = None
    rank = get("attention.kv_lora_rank")
    if rank:
        rope = get("rope.dimension_count")
        if not rope:
            raise ValueError(f"{file}: {arch}.attention.kv_lora_rank without {arch}.rope.dimension_count")
        latent = int(rank) + int(rope)
        sources["kv_latent_dim"] = f"{src}.attention.kv_lora_rank + rope.dimension_count (MLA)"
        assumptions.append(f"MLA: one latent of {latent} values per token per layer, shared by all heads")

    sliding_layers = 0
    window = get("attention.sliding_window")
    if window:
        pattern = get("attention.sliding_window_pattern")
        if isinstance(pattern, list):
            flags = [bool(p) for p in pattern[:kv_layers]]
            sliding_layers = sum(flags)
            sources["sliding_layers"] = f"{src}.attention.sliding_window_pattern"
        elif arch in SWA_PATTERN:
            n = SWA_PATTERN[arch]
            sliding_layers = sum(1 for i in range(kv_layers) if i % n < n - 1)
            sources["sliding_layers"] = f"llama.cpp's {arch} layout: {n - 1} of every {n} layers slide"
        else:
            sliding_layers = kv_layers
            assumptions.append(f"{arch}: a sliding_window without a per-layer pattern; every layer taken as sliding")
        sources["sliding_window"] = f"{src}.attention.sliding_window"

    context = get("context_length")
    name = _value(reader, "general.name") or file.stem
    return ModelShape(
        name=str(name),
        layers=layers,
        kv_layers=kv_layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        seq_state_bytes=seq_state,
        total_params=float(total) if total else None,
        active_params=active if total else None,
        expert_params=float(expert) if expert else None,
        experts=int(experts) if experts else None,
        experts_used=int(experts_used) if experts_used else None,
        weight_bytes=_file_bytes(file),
        context_length=int(context) if context else None,
        sliding_layers=sliding_layers,
        sliding_window=int(window) if window else None,
        kv_latent_dim=latent,
        state_layers=(layers - kv_layers) if seq_state else None,
        sources=sources,
        assumptions=tuple(assumptions),
    ).validate()
