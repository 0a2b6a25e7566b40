"""vLLM's KV arithmetic as a pure function, on small hand-made layer lists, and quantised weight sizes.

Each expected value is worked out in the comment beside it from vLLM 0.32.0's rules (kv_cache_utils.py:
``get_kv_cache_config_from_groups``, ``_get_kv_cache_groups_uniform_page_size``, ``get_kv_cache_capacity``,
``get_max_concurrency_for_kv_cache_config``; kv_cache_interface.py: each spec's
``max_memory_usage_bytes``; the hybrid block-size alignment). The defaults are a GPU's: 2 batches in flight
(async scheduling), prefix caching on.
"""

from __future__ import annotations

import pytest

from gateway.plan import shape_from_hf_config
from gateway.plan.vllm_view import LayerSpec, layer_specs, vllm_kv_view
from tests.unit.test_plan_published import LLAMA31_8B

MIB = 2**20


def test_uniform_full_attention_is_one_group() -> None:
    layers = [LayerSpec("full", 1000)] * 4
    view = vllm_kv_view(layers, 10 * MIB, max_model_len=1000, block_size=16)
    assert view is not None
    # page 16 x 1000 = 16,000 B; blocks 10,485,760 // 16,000 // 4 = 655 // 4 = 163
    # a 1000-token request: ceil(1000 / 16) = 63 blocks -> 163 / 63 = 2.587x; tokens int(2.587 x 1000) = 2587
    # (not 163 x 16 = 2608: the request's last block is not full)
    assert (view.page_bytes, view.num_blocks, view.kv_cache_tokens, view.blocks_per_request) == (16_000, 163, 2587, 63)
    assert view.max_concurrency == pytest.approx(163 / 63)
    assert view.starts  # 4 x 16,000 x 63 = 4,032,000 <= 10,485,760


def test_near_equal_kinds_use_the_larger_group_size() -> None:
    # 12 sliding + 13 full (gpt-oss-20b with an EAGLE layer): 13 < 1.5 x 12, so group size 13, 2 groups, 1 padding
    layers = [LayerSpec("sliding", 100, window=128)] * 12 + [LayerSpec("full", 100)] * 13
    view = vllm_kv_view(layers, 1_000_000, max_model_len=4096, block_size=16, max_num_batched_tokens=2048)
    assert view is not None
    assert (view.group_size, view.groups, view.padding_layers) == (13, 2, 1)
    # page 1600; blocks 1,000,000 // 1600 // 13 = 625 // 13 = 48
    # request: full ceil(4096 / 16) = 256 + sliding ceil(min(127 + 2 x 2048, 4096) / 16) + 1 = 256 + 1 = 257 -> 513
    # tokens int(48 / 513 x 4096) = int(383.25) = 383
    assert (view.num_blocks, view.kv_cache_tokens, view.blocks_per_request) == (48, 383, 513)
    assert not view.starts  # 13 x 1600 x 513 > 1,000,000
    # one batch in flight (the CPU build): sliding ceil(min(127 + 2048, 4096) / 16) + 1 = 137 -> 393
    single = vllm_kv_view(
        layers, 1_000_000, max_model_len=4096, block_size=16, max_num_batched_tokens=2048, concurrent_batches=1
    )
    assert single is not None and single.blocks_per_request == 393


def test_chunked_layers_reserve_chunk_plus_batch() -> None:
    # Llama-4-style: 36 chunked (8192) + 12 full -> group size 12, 1 + 3 = 4 groups
    layers = [LayerSpec("chunked", 2048, window=8192)] * 36 + [LayerSpec("full", 2048)] * 12
    view = vllm_kv_view(layers, 2**34, max_model_len=131_072, block_size=16, max_num_batched_tokens=8192)
    assert view is not None
    # page 32,768; blocks 17,179,869,184 // 32,768 // 12 = 43,690
    # request: full 131,072 / 16 = 8192 + 3 x ceil(min(8192 + 2 x 8192, 131,072) / 16) = 3 x 1536 -> 12,800
    # tokens int(43,690 / 12,800 x 131,072) = int(447,385.6) = 447,385
    assert (view.groups, view.num_blocks, view.kv_cache_tokens, view.blocks_per_request) == (4, 43_690, 447_385, 12_800)


def test_state_page_sets_the_attention_block() -> None:
    # attention 2048 B/token; state 100,000 B: block = 16 x ceil(100,000 / (16 x 2048)) = 16 x 4 = 64
    layers = [LayerSpec("full", 2048)] + [LayerSpec("state", state_bytes=100_000)] * 3
    view = vllm_kv_view(layers, 10**8, max_model_len=1000, block_size=16)
    assert view is not None
    # page 64 x 2048 = 131,072 (the state padded up to it); group size 1, 4 groups
    # blocks 100,000,000 // 131,072 // 1 = 762
    # request: ceil(1000 / 64) = 16 + 3 x 2 state pages (prefix caching: mamba_cache_mode "align") = 22
    # -> 762 / 22 = 34.6x; tokens int(34.636 x 1000) = 34,636
    assert (view.block_size, view.page_bytes, view.groups) == (64, 131_072, 4)
    assert (view.num_blocks, view.kv_cache_tokens, view.blocks_per_request) == (762, 34_636, 22)
    lean = vllm_kv_view(layers, 10**8, max_model_len=1000, block_size=16, prefix_caching=False)
    assert lean is not None and lean.blocks_per_request == 19  # 16 + 3 x 1 -> 40.1x


def test_llama4_layout_from_config() -> None:
    cfg = dict(LLAMA31_8B, model_type="llama4_text", num_hidden_layers=48, attention_chunk_size=8192)
    shape = shape_from_hf_config(cfg)
    # no no_rope_layers: every 4th layer (i + 1) % 4 == 0 is NoPE and global -> 12 full, 36 chunked
    assert (shape.full_layers, shape.chunked_layers, shape.attention_chunk) == (12, 36, 8192)
    kinds = [spec.kind for spec in layer_specs(shape)]
    assert kinds.count("chunked") == 36 and kinds.count("full") == 12


AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
CT_FP8 = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
        }
    },
}
CT_W4_GROUP = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True},
        }
    },
}


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        # Llama-3.1-8B linear layers: attention 1,342,177,280 + MLP 5,637,144,576 = 6,979,321,856 weights;
        # embeddings + LM head 1,050,673,152 stay bf16 = 2,101,346,304 B.
        # AWQ/GPTQ 4-bit, group 128: 0.5 B + (2 B scale + 0.5 B zero) / 128 = 0.51953125 B per weight
        #   6,979,321,856 x 0.51953125 = 3,625,975,808 -> 5,727,322,112 B (published AWQ-INT4 files: 5.73 GB)
        (AWQ, 5_727_322_112),
        (GPTQ, 5_727_322_112),
        # compressed-tensors FP8 per channel: 1 B per weight: 6,979,321,856 + 2,101,346,304 = 9,080,668,160
        (CT_FP8, 9_080_668_160),
        # compressed-tensors int4 group 128, symmetric: 0.5 + 2/128 = 0.515625 -> 3,598,712,832 + 2,101,346,304
        (CT_W4_GROUP, 5_700_059_136),
    ],
)
def test_quantised_llama_weight_bytes(quant: dict, expected: int) -> None:
    shape = shape_from_hf_config(dict(LLAMA31_8B, quantization_config=quant))
    assert shape.resolved_weight_bytes == expected
