"""Reading a model's shape from a GGUF file (written here with gguf.GGUFWriter) and from config.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from gateway.plan import estimate_params, plan_capacity, shape_from_gguf, shape_from_hf_config


def _write_gguf(path: Path, arch: str, meta: dict, tensors: dict[str, tuple[int, ...]]) -> None:
    writer = GGUFWriter(str(path), arch)
    for key, value in meta.items():
        if isinstance(value, list):
            writer.add_array(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_name("test-" + arch)
    for name, shape in tensors.items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_hybrid_moe_shape(tmp_path: Path) -> None:
    path = tmp_path / "qwen35moe-tiny.gguf"
    _write_gguf(
        path,
        "qwen35moe",
        {
            "block_count": 40,
            "context_length": 262_144,
            "embedding_length": 2048,
            "attention.head_count": 16,
            "attention.head_count_kv": 2,
            "attention.key_length": 256,
            "attention.value_length": 256,
            "full_attention_interval": 4,
            "expert_count": 256,
            "expert_used_count": 8,
            "ssm.conv_kernel": 4,
            "ssm.inner_size": 4096,
            "ssm.state_size": 128,
            "ssm.group_count": 16,
        },
        {
            "token_embd.weight": (8, 16),  # 128 values
            "blk.0.ffn_gate_exps.weight": (256, 4, 4),  # 4096 values in routed experts
            "blk.0.ffn_up_shexp.weight": (4, 4),  # 16 values in the shared expert (always active)
        },
    )
    shape = shape_from_gguf(path)
    assert shape.name == "test-qwen35moe"
    assert shape.layers == 40
    # layers i with (i+1) % 4 == 0: 3, 7, ..., 39 -> 10 full-attention layers
    assert shape.kv_layers == 10
    assert (shape.kv_heads, shape.head_dim, shape.head_dim_v) == (2, 256, 256)
    # 2 x 10 x 2 x 256 x 2 B = 20,480 B/token
    assert shape.kv_bytes_per_token == 20_480
    # 30 recurrent layers x ((4-1) x (4096 + 2x16x128) + 128 x 4096) x 4 B = 30 x 548,864 x 4 = 65,863,680
    assert shape.seq_state_bytes == 65_863_680
    assert (shape.experts, shape.experts_used, shape.context_length) == (256, 8, 262_144)
    # params: 128 + 4096 + 16 = 4240 total; active = 4240 - 4096 + 4096 x 8/256 = 144 + 128 = 272
    assert shape.total_params == 4240
    assert shape.expert_params == 4096
    assert shape.active_params == 272
    assert shape.weight_bytes == os.path.getsize(path)
    assert shape.sources["kv_layers"].endswith("full_attention_interval=4")


def test_gguf_dense_head_dim_from_embedding(tmp_path: Path) -> None:
    path = tmp_path / "llama-tiny.gguf"
    _write_gguf(
        path,
        "llama",
        {"block_count": 32, "embedding_length": 4096, "attention.head_count": 32, "attention.head_count_kv": 8},
        {"token_embd.weight": (4, 4)},
    )
    shape = shape_from_gguf(path)
    # no key_length: head dim = 4096 / 32 = 128; KV = 2 x 32 x 8 x 128 x 2 = 131,072 B/token
    assert (shape.kv_layers, shape.head_dim) == (32, 128)
    assert shape.kv_bytes_per_token == 131_072
    assert shape.seq_state_bytes == 0
    assert shape.active_params == shape.total_params == 16


def test_gguf_per_layer_kv_heads_mark_recurrent_layers(tmp_path: Path) -> None:
    path = tmp_path / "hybrid-array.gguf"
    _write_gguf(
        path,
        "granitehybrid",
        {
            "block_count": 4,
            "embedding_length": 64,
            "attention.head_count": 4,
            "attention.head_count_kv": [0, 2, 0, 2],
            "ssm.conv_kernel": 4,
            "ssm.inner_size": 128,
            "ssm.state_size": 16,
            "ssm.group_count": 1,
        },
        {"token_embd.weight": (4, 4)},
    )
    shape = shape_from_gguf(path)
    # two layers with KV heads: 2 x 2 layers x 2 heads x (64/4 = 16) x 2 B = 256 B/token
    assert (shape.kv_layers, shape.kv_heads, shape.head_dim) == (2, 2, 16)
    assert shape.kv_bytes_per_token == 256
    # 2 recurrent layers x ((4-1) x (128 + 2x1x16) + 16 x 128) x 4 B = 2 x (480 + 2048) x 4 = 20,224
    assert shape.seq_state_bytes == 20_224


def test_gguf_without_architecture_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError):
        shape_from_gguf(path)


# Public configs, reduced to the keys the planner reads (values as published on Hugging Face).
LLAMA3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 8192,
}
MIXTRAL_8X7B = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "torch_dtype": "bfloat16",
}
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN3_NEXT_80B_A3B = {
    "model_type": "qwen3_next",
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "vocab_size": 151936,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("cfg", "total", "active"),
    [
        (LLAMA3_8B, 8.03e9, 8.03e9),  # Meta: 8.03B
        (MIXTRAL_8X7B, 46.7e9, 12.9e9),  # Mistral: 46.7B total, 12.9B active
        (QWEN3_30B_A3B, 30.5e9, 3.3e9),  # Qwen: 30.5B total, 3.3B activated
    ],
)
def test_param_estimate_matches_published_counts(cfg: dict, total: float, active: float) -> None:
    est_total, est_active, _ = estimate_params(cfg)
    assert est_total == pytest.approx(total, rel=0.01)
    assert est_active == pytest.approx(active, rel=0.02)


def test_hf_config_dense(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    shape = shape_from_hf_config(path)
    # bf16 KV (vLLM "auto" = model dtype): 2 x 32 x 8 x 128 x 2 = 131,072 B/token
    assert shape.kv_bytes_per_token == 131_072
    assert shape.kv_dtype == "bf16" and shape.weight_quant == "bf16"
    assert shape.resolved_weight_bytes == pytest.approx(8.03e9 * 2, rel=0.01)


def test_hf_config_moe_qwen3_30b_a3b() -> None:
    shape = shape_from_hf_config(QWEN3_30B_A3B)
    # 2 x 48 layers x 4 KV heads x 128 x 2 B = 98,304 B/token
    assert shape.kv_bytes_per_token == 98_304
    assert (shape.experts, shape.experts_used) == (128, 8)
    plan = plan_capacity(shape, gpu_gb=80, util=0.9, overhead_gb=2)
    # memory counts all experts: ~30.5B x 2 B = ~61 GB of bf16 weights, not ~6.6 GB of active ones
    assert plan.weight_bytes == pytest.approx(61e9, rel=0.01)


def test_hf_config_hybrid_qwen3_next() -> None:
    shape = shape_from_hf_config(QWEN3_NEXT_80B_A3B)
    # full_attention_interval 4 over 48 layers -> 12 KV layers, 36 gated DeltaNet layers
    assert (shape.layers, shape.kv_layers) == (48, 12)
    # 2 x 12 x 2 KV heads x 256 x 2 B (bf16) = 24,576 B/token
    assert shape.kv_bytes_per_token == 24_576
    # per DeltaNet layer (bf16, no mamba_ssm_dtype): recurrent 32 x 128 x 128 x 2 = 1,048,576
    # + conv (4-1) x (2x16x128 + 32x128 = 8192) x 2 = 49,152 -> 1,097,728 B; x 36 = 39,518,208 B
    assert shape.seq_state_bytes == 39_518_208
    total, active, _ = estimate_params(QWEN3_NEXT_80B_A3B)
    assert 79e9 < total < 81e9  # Qwen: 80B total (79B non-embedding)
    assert 3e9 < active < 4.5e9  # "3B activated" excludes the embeddings


def test_hf_config_multimodal_text_config_and_layer_types() -> None:
    # Qwen3.5/3.6 multimodal layout: the language model sits under text_config; layer_types lists
    # three linear_attention layers then one full_attention, ten times; mamba_ssm_dtype float32.
    text = dict(
        QWEN3_NEXT_80B_A3B,
        num_hidden_layers=40,
        num_experts=256,
        num_experts_per_tok=8,
        vocab_size=248320,
        attn_output_gate=True,
        mamba_ssm_dtype="float32",
    )
    text.pop("full_attention_interval")
    text["layer_types"] = (["linear_attention"] * 3 + ["full_attention"]) * 10
    shape = shape_from_hf_config({"model_type": "qwen3_5_moe", "text_config": text})
    assert (shape.layers, shape.kv_layers) == (40, 10)
    # 2 x 10 x 2 x 256 x 2 = 20,480 B/token
    assert shape.kv_bytes_per_token == 20_480
    # per layer: recurrent 32 x 128 x 128 x 4 (float32) = 2,097,152 + conv 3 x 8192 x 2 = 49,152
    # = 2,146,304 B; x 30 = 64,389,120 B
    assert shape.seq_state_bytes == 64_389_120
    total, _, _ = estimate_params({"text_config": text})
    assert total == pytest.approx(35e9, rel=0.03)  # Qwen: "35B in total" (text model; vision tower aside)


def test_hf_config_missing_keys_are_explained() -> None:
    with pytest.raises(ValueError, match="num_hidden_layers"):
        shape_from_hf_config({"model_type": "bert"})


def test_gguf_mla_caches_the_latent(tmp_path: Path) -> None:
    path = tmp_path / "deepseek2-tiny.gguf"
    _write_gguf(
        path,
        "deepseek2",
        {
            "block_count": 27,
            "embedding_length": 2048,
            "attention.head_count": 16,
            "attention.head_count_kv": 16,
            "attention.key_length": 192,
            "attention.value_length": 128,
            "attention.kv_lora_rank": 512,
            "rope.dimension_count": 64,
        },
        {"token_embd.weight": (4, 4)},
    )
    shape = shape_from_gguf(path)
    # one latent of 512 + 64 = 576 values x 2 B (fp16) x 27 layers = 31,104 B/token
    # (the per-head reading would be 27 x 16 x (192 + 128) x 2 = 276,480)
    assert shape.kv_latent_dim == 576
    assert shape.kv_bytes_per_token == 31_104
    assert any("MLA" in note for note in shape.assumptions)


def test_gguf_sliding_layers_follow_llama_cpp_pattern(tmp_path: Path) -> None:
    path = tmp_path / "gemma3-tiny.gguf"
    _write_gguf(
        path,
        "gemma3",
        {
            "block_count": 26,
            "embedding_length": 1152,
            "attention.head_count": 4,
            "attention.head_count_kv": 1,
            "attention.key_length": 256,
            "attention.value_length": 256,
            "attention.sliding_window": 512,
        },
        {"token_embd.weight": (4, 4)},
    )
    shape = shape_from_gguf(path)
    # llama.cpp gemma3: layer i slides when i % 6 < 5 -> globals at 5, 11, 17, 23: 22 sliding, 4 full
    assert (shape.sliding_layers, shape.full_layers, shape.sliding_window) == (22, 4, 512)
    # per layer 2 x 1 x 256 x 2 B = 1024; a 32K sequence: (4 x 32768 + 22 x 512) x 1024 = 145,752,064 B
    assert shape.sequence_kv_bytes(32_768) == 145_752_064
