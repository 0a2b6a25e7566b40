"""What vLLM itself will log for a KV budget: "GPU KV cache size: N tokens" and "Maximum concurrency for
L tokens per request: X" (the CPU build says "CPU KV cache size").

The planner's own view is per sequence (bytes one sequence of L tokens holds). vLLM's (v1 engine, as of
vLLM 0.32.0: ``vllm/v1/core/kv_cache_utils.py`` and ``vllm/v1/kv_cache_interface.py``) is per block and per
group, and differs in the ways this module reproduces (``tests/integration/test_plan_vllm.py`` checks them
against the figures a real vLLM logs):

* **Pages.** Every layer's cache is cut into pages of ``block_size`` tokens (16 by default); an MLA layer's
  page holds the latent (one "head" of ``kv_lora_rank + qk_rope_head_dim``), a linear-attention / Mamba
  layer's page holds one sequence's whole state.
* **Hybrid page alignment.** All pages must be the same size. With Mamba-style layers vLLM raises the
  attention block size to ``align x ceil(state page / (align x attention bytes per token))`` (``align`` = the
  attention kernel's block alignment, 16, or the configured block size if larger) and pads the state page
  up to the attention page.
* **Groups.** A model with one layer kind is one group of all its layers: ``num_blocks = memory // page //
  layers``. Mixed kinds are split into groups of equal layer count (the smallest kind's count, or the
  largest when it is under 1.5x the smallest), padding the last group of a kind; the memory is shared by
  ``group size`` tensors and every group draws its blocks from them.
* **Per-request reservations.** A sliding layer reserves ``ceil(min(window - 1 + in_flight, L) / block) +
  1`` blocks per request, a chunked layer ``ceil(min(chunk + in_flight, L) / block)``, a full layer
  ``ceil(L / block)``, a state layer one page, or two with prefix caching (``vllm serve``'s default, which
  turns on ``mamba_cache_mode`` "align"). ``in_flight`` is ``max_num_batched_tokens`` times the batches in
  flight: 2 with async scheduling (the default on a GPU), 1 on the CPU build, which turns it off.
  Maximum concurrency is ``num_blocks /`` the blocks one request of ``max_model_len`` tokens reserves over
  all groups, as a float (vLLM prints 2 decimals).
* **The logged token count** is ``int(max concurrency x max_model_len)`` (``get_kv_cache_capacity``), so it
  follows the reservations above, not the pool: a sliding-window model logs more tokens than its blocks
  hold, a hybrid one fewer. For one group of full-attention layers it is ``num_blocks x block``.

vLLM also refuses to start when one request of ``max_model_len`` does not fit (``starts`` is False).
This is a pure function of integers so a test against a real vLLM can call it with the numbers vLLM used.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.plan.shape import ModelShape

LayerKind = Literal["full", "sliding", "chunked", "state"]

VLLM_BLOCK_SIZE = 16  # CacheConfig.block_size default on GPU
VLLM_KERNEL_BLOCK_ALIGNMENT = 16  # smallest block the FlashAttention/FlashInfer kernels take
VLLM_GPU_CONCURRENT_BATCHES = 2  # VllmConfig.max_concurrent_batches with async scheduling (GPU default)
VLLM_CPU_CONCURRENT_BATCHES = 1  # the CPU platform turns async scheduling off


@dataclass(frozen=True)
class LayerSpec:
    """One layer as vLLM's KV cache manager sees it.

    ``bytes_per_token`` is one token's cache in this layer (attention kinds); ``state_bytes`` is one
    sequence's state (kind ``state``). ``window`` is the sliding window or the attention chunk.
    """

    kind: LayerKind
    bytes_per_token: int = 0
    state_bytes: int = 0
    window: int | None = None


@dataclass(frozen=True)
class VllmKVView:
    """The figures vLLM derives for a KV budget, and how it got them."""

    block_size: int  # tokens per attention page after hybrid alignment
    page_bytes: int  # bytes of one page of one layer (all layers share it)
    groups: int  # KV cache groups
    group_size: int  # layers per group (tensors sharing the memory)
    padding_layers: int  # empty slots added to make every group the same size
    num_blocks: int
    kv_cache_tokens: int  # "GPU KV cache size: N tokens": int(max_concurrency x max_model_len)
    max_model_len: int
    blocks_per_request: int  # blocks one request of max_model_len reserves over all groups
    max_concurrency: float  # "Maximum concurrency for L tokens per request: X"
    starts: bool  # False: vLLM refuses, one max_model_len request does not fit


def _aligned_block_size(layers: Sequence[LayerSpec], block_size: int, alignment: int) -> int:
    """vLLM raises the attention block size until an attention page holds a whole state page."""
    states = [layer.state_bytes for layer in layers if layer.kind == "state"]
    attention = [layer.bytes_per_token for layer in layers if layer.kind != "state"]
    if not states or not attention:
        return block_size
    align = max(alignment, block_size)
    per_token = max(attention)
    needed = align * math.ceil(max(states) / (align * per_token))
    return max(block_size, needed)


def _page_bytes(layer: LayerSpec, block_size: int) -> int:
    if layer.kind == "state":
        return layer.state_bytes
    return block_size * layer.bytes_per_token


def _request_blocks(
    layer: LayerSpec, block_size: int, max_model_len: int, in_flight_tokens: int, prefix_caching: bool
) -> int:
    """Blocks one request of ``max_model_len`` tokens reserves in a layer of this kind."""
    if layer.kind == "state":
        return 2 if prefix_caching else 1  # MambaSpec.max_memory_usage_bytes: "align" keeps two states
    if layer.kind == "full":
        return math.ceil(max_model_len / block_size)
    assert layer.window is not None
    if layer.kind == "sliding":
        tokens = min(layer.window - 1 + in_flight_tokens, max_model_len)
        return math.ceil(tokens / block_size) + 1  # the window may start mid-block
    tokens = min(layer.window + in_flight_tokens, max_model_len)
    return math.ceil(tokens / block_size)


def vllm_kv_view(
    layers: Sequence[LayerSpec],
    available_bytes: int,
    max_model_len: int,
    block_size: int = VLLM_BLOCK_SIZE,
    max_num_batched_tokens: int = 2048,
    kernel_block_alignment: int = VLLM_KERNEL_BLOCK_ALIGNMENT,
    concurrent_batches: int = VLLM_GPU_CONCURRENT_BATCHES,
    prefix_caching: bool = True,
) -> VllmKVView | None:
    """vLLM's KV cache size and maximum concurrency for ``layers`` in ``available_bytes`` of KV memory.

    ``concurrent_batches``: batches in flight (2 with async scheduling, vLLM's default on a GPU; 1 on the
    CPU build or with ``--no-async-scheduling``). ``prefix_caching``: ``vllm serve``'s default (on); off,
    a linear-attention layer reserves one state page per request instead of two.
    Returns None for a model without any cache layer (vLLM logs nothing then).
    """
    if not layers:
        return None
    if (
        available_bytes < 0
        or max_model_len <= 0
        or block_size <= 0
        or max_num_batched_tokens <= 0
        or concurrent_batches <= 0
    ):
        raise ValueError("KV memory must be >= 0; max_model_len, block size, batched tokens and batches positive")
    block = _aligned_block_size(layers, block_size, kernel_block_alignment)
    pages = {_page_bytes(layer, block) for layer in layers if layer.kind != "state"}
    if len(pages) > 1:
        raise ValueError("vLLM view: attention layers with different page sizes are not modelled")
    page = pages.pop() if pages else max(_page_bytes(layer, block) for layer in layers)
    if page <= 0:
        raise ValueError("vLLM view: a layer has no cache bytes")

    # layers of one kind (and one window) share a spec; vLLM groups layers by spec
    kinds = Counter((layer.kind, layer.window) for layer in layers)
    spec_of = {(layer.kind, layer.window): layer for layer in layers}
    if len(kinds) == 1:
        group_size = len(layers)
        groups = 1
        padding = 0
    else:
        smallest, largest = min(kinds.values()), max(kinds.values())
        group_size = largest if largest < smallest * 1.5 else smallest
        groups = sum(math.ceil(count / group_size) for count in kinds.values())
        padding = groups * group_size - len(layers)

    num_blocks = max(0, available_bytes // page // group_size)
    in_flight = concurrent_batches * max_num_batched_tokens
    per_request = 0
    for key, count in kinds.items():
        spec = spec_of[key]
        spec_groups = 1 if len(kinds) == 1 else math.ceil(count / group_size)
        per_request += spec_groups * _request_blocks(spec, block, max_model_len, in_flight, prefix_caching)
    concurrency = num_blocks / per_request
    tokens = int(concurrency * max_model_len)  # get_kv_cache_capacity, in the same float arithmetic
    needed = group_size * page * per_request
    return VllmKVView(
        block_size=block,
        page_bytes=page,
        groups=groups,
        group_size=group_size,
        padding_layers=padding,
        num_blocks=num_blocks,
        kv_cache_tokens=tokens,
        max_model_len=max_model_len,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        starts=needed <= available_bytes,
    )


def layer_specs(shape: ModelShape) -> list[LayerSpec]:
    """The shape's layers as vLLM's cache manager would see them (order does not matter to it)."""
    specs: list[LayerSpec] = []
    if shape.attention_layers:
        row = shape.kv_row_bytes
        specs += [LayerSpec("full", row)] * shape.full_layers
        specs += [LayerSpec("sliding", row, window=shape.sliding_window)] * shape.sliding_layers
        specs += [LayerSpec("chunked", row, window=shape.attention_chunk)] * shape.chunked_layers
    count = shape.state_layer_count
    if count:
        specs += [LayerSpec("state", state_bytes=math.ceil(shape.seq_state_bytes / count))] * count
    return specs
