"""Published configs, planned: weights, KV bytes per token, sequences, and what vLLM will log.

Each config is written here from its published config.json on Hugging Face, reduced to the keys the
planner reads. Every expected value is derived in the comments from those values (never copied from
the planner's output): parameters by layer class, weights at the served dtype or the checkpoint's
quantisation, KV per token per layer, then the sequences at 32K on one 80 GiB GPU at vLLM's default
utilisation 0.9 with a 2 GiB overhead:

    budget = 80 x 2^30 x 0.9 = 77,309,411,328 B;  less 2 GiB overhead = 75,161,927,680 B before weights

and vLLM's own figures (vLLM 0.32.0's rules; block 16; max_num_batched_tokens 8192, vllm serve's default on a
GPU >= 70 GiB, and 2 batches in flight, async scheduling's default on a GPU; prefix caching on):

    blocks = KV memory // (16 x bytes per token per layer) // layers per group
    concurrency = blocks / blocks one 32K request reserves;  tokens = int(concurrency x 32768)
    a sliding layer reserves ceil(min(window - 1 + 2 x 8192, 32768) / 16) + 1 blocks; a state layer 2 pages
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.plan import ModelShape, plan_capacity, shape_from_hf_config
from gateway.plan.arith import plan_fixed_kv
from gateway.plan.vllm_view import layer_specs, vllm_kv_view

GIB = 2**30
CTX = 32_768

LLAMA31_8B = {  # meta-llama/Llama-3.1-8B
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
}
QWEN3_8B = {  # Qwen/Qwen3-8B (sliding_window present but use_sliding_window false: no sliding)
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 40960,
    "sliding_window": None,
    "use_sliding_window": False,
    "max_window_layers": 36,
}
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B
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
    "max_position_embeddings": 40960,
    "sliding_window": None,
    "use_sliding_window": False,
}
QWEN3_NEXT_80B_A3B = {  # Qwen/Qwen3-Next-80B-A3B-Instruct
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
    "max_position_embeddings": 262144,
}
MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 32768,
}
DEEPSEEK_V2_LITE = {  # deepseek-ai/DeepSeek-V2-Lite
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 102400,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 163840,
}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 (the FP8 checkpoint)
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 163840,
    "num_nextn_predict_layers": 1,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}
KIMI_K2 = {  # moonshotai/Kimi-K2-Instruct: DeepSeek-V3's architecture with 64 heads and 384 experts
    "model_type": "kimi_k2",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 163840,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}
GEMMA2_9B = {  # google/gemma-2-9b: no tie_word_embeddings key, float32 checkpoint, no layer_types
    "model_type": "gemma2",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "torch_dtype": "float32",
}
GEMMA3_1B = {  # google/gemma-3-1b-it: no tie_word_embeddings key, no layer_types
    "model_type": "gemma3_text",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "vocab_size": 262144,
    "max_position_embeddings": 32768,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
}
MISTRAL_7B_V01 = {  # mistralai/Mistral-7B-v0.1: a model-wide 4096-token sliding window
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
GPT_OSS_20B = {  # openai/gpt-oss-20b: alternating sliding (128) / full layers, MXFP4 experts
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 201088,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    },
}


def _plan80(cfg: dict[str, Any]) -> tuple[ModelShape, Any]:
    shape = shape_from_hf_config(cfg)
    return shape, plan_capacity(shape, gpu_gb=80, util=0.9, overhead_gb=2)


def _vllm(shape: ModelShape, kv_bytes: int, batched: int = 8192) -> Any:
    view = vllm_kv_view(layer_specs(shape), kv_bytes, CTX, 16, batched)
    assert view is not None
    return view


def test_llama31_8b_dense_gqa() -> None:
    shape, plan = _plan80(LLAMA31_8B)
    # attention per layer: q 4096x4096 + k,v 2x4096x(8x128) + o 4096x4096 = 41,943,040; x32 = 1,342,177,280
    # MLP 3 x 4096 x 14336 = 176,160,768; x32 = 5,637,144,576; embed + untied head 2 x 128256 x 4096 = 1,050,673,152
    # total = 8,029,995,008 (Meta: 8.03B); bf16 weights 16,059,990,016 B
    assert shape.total_params == 8_029_995_008
    assert plan.weight_bytes == 16_059_990_016
    # KV: 32 layers x 2 x 8 heads x 128 x 2 B = 131,072 B/token
    assert shape.kv_bytes_per_token == 131_072
    # KV memory 75,161,927,680 - 16,059,990,016 = 59,101,937,664; 32K seq = 32768 x 131,072 = 4 GiB
    # -> floor(13.76) = 13
    assert plan.kv_memory_bytes == 59_101_937_664
    assert plan.max_sequences(CTX) == 13
    # vLLM: page 16 x 4096 B = 65,536; blocks 59,101,937,664 // 65,536 // 32 = 28,182
    # a 32K request: 2048 blocks -> 28,182 / 2048 = 13.76x; tokens 13.76 x 32768 = 28,182 x 16 = 450,912
    view = _vllm(shape, plan.kv_memory_bytes)
    assert (view.num_blocks, view.kv_cache_tokens, view.groups) == (28_182, 450_912, 1)
    assert view.max_concurrency == pytest.approx(28_182 / 2048)
    # a 32K context is within Llama-3.1's native 131,072
    assert shape.context_length == 131_072


def test_qwen3_8b_dense() -> None:
    shape, plan = _plan80(QWEN3_8B)
    # attention per layer: q 4096 x 32 x 128 + k,v 2 x 4096 x 8 x 128 + o 32 x 128 x 4096 = 41,943,040;
    #   x36 = 1,509,949,440
    # MLP 3 x 4096 x 12288 = 150,994,944; x36 = 5,435,817,984; embed + head 2 x 151936 x 4096 = 1,244,659,712
    # total 8,190,427,136 (Qwen: 8.2B); bf16 16,380,854,272 B
    assert shape.total_params == 8_190_427_136
    assert plan.weight_bytes == 16_380_854_272
    assert shape.sliding_layers == 0  # use_sliding_window: false
    # KV: 36 x 2 x 8 x 128 x 2 = 147,456 B/token; 32K seq 4,831,838,208 B
    assert shape.kv_bytes_per_token == 147_456
    # 75,161,927,680 - 16,380,854,272 = 58,781,073,408 -> floor(12.17) = 12
    assert plan.max_sequences(CTX) == 12


def test_qwen3_30b_a3b_moe() -> None:
    shape, plan = _plan80(QWEN3_30B_A3B)
    # attention per layer: q 2048 x 32 x 128 + k,v 2 x 2048 x 4 x 128 + o = 18,874,368; x48 = 905,969,664
    # experts: 128 x 3 x 2048 x 768 = 603,979,776 per layer; x48 = 28,991,029,248; router 2048 x 128 x 48 = 12,582,912
    # embed + head 2 x 151936 x 2048 = 622,329,856 -> total 30,531,911,680 (Qwen: 30.5B)
    # active: 30,531,911,680 - 28,991,029,248 + 48 x 8 x 4,718,592 = 3,352,821,760 (Qwen: 3.3B)
    assert shape.total_params == 30_531_911_680
    assert shape.active_params == 3_352_821_760
    assert plan.weight_bytes == 61_063_823_360  # bf16, every expert resident
    # KV: 48 x 2 x 4 x 128 x 2 = 98,304 B/token; 32K seq = 3,221,225,472 B
    assert shape.kv_bytes_per_token == 98_304
    # 75,161,927,680 - 61,063,823,360 = 14,098,104,320 -> floor(4.38) = 4
    assert plan.max_sequences(CTX) == 4


def test_mixtral_8x7b_does_not_fit_one_80g_gpu() -> None:
    shape, plan = _plan80(MIXTRAL_8X7B)
    # attention 41,943,040 x 32 = 1,342,177,280; experts 8 x 176,160,768 x 32 = 45,097,156,608
    # router 4096 x 8 x 32 = 1,048,576; embed + head 2 x 32000 x 4096 = 262,144,000 -> 46,702,526,464 (46.7B)
    # active: 46,702,526,464 - 45,097,156,608 + 32 x 2 x 176,160,768 = 12,879,659,008 (12.9B)
    assert shape.total_params == 46_702_526_464
    assert shape.active_params == 12_879_659_008
    # bf16 93,405,052,928 B > 75,161,927,680: short by 18,243,125,248 B
    assert plan.weight_bytes == 93_405_052_928
    assert not plan.fits
    assert plan.shortfall_bytes == 18_243_125_248
    assert plan.max_sequences(CTX) == 0


def test_qwen3_next_hybrid_and_vllms_state_pages() -> None:
    shape = shape_from_hf_config(QWEN3_NEXT_80B_A3B)
    # 12 attention layers (every 4th), 36 gated-DeltaNet layers
    # attention (gated q doubles q): 2048 x 16 x 256 x 2 + 2 x 2048 x 2 x 256 + 16 x 256 x 2048 = 27,262,976;
    #   x12 = 327,155,712
    # DeltaNet: 2048 x (2x2048 + 2x4096) + 2048 x 2 x 32 + (2x2048 + 4096) x 4 + 4096 x 2048 = 33,718,272;
    #   x36 = 1,213,857,792
    # experts 512 x 3 x 2048 x 512 = 1,610,612,736 per layer, x48 = 77,309,411,328;
    #   shared 3 x 2048 x 512 x 48 = 150,994,944
    # router 2048 x 512 x 48 = 50,331,648; embed + head 622,329,856 -> total 79,674,081,280 (Qwen: 80B)
    assert shape.total_params == 79_674_081_280
    # KV: 12 x 2 x 2 x 256 x 2 = 24,576 B/token; state per DeltaNet layer (bf16): recurrent 32 x 128 x 128 x 2
    # = 1,048,576 + conv 3 x (2 x 16 x 128 + 32 x 128) x 2 = 49,152 -> 1,097,728; x36 = 39,518,208 B
    assert shape.kv_bytes_per_token == 24_576
    assert shape.seq_state_bytes == 39_518_208
    plan = plan_fixed_kv(shape, 16)
    # 16 GiB = 17,179,869,184 B: planner KV tokens 17,179,869,184 // 24,576 = 699,050
    # 32K seq = 32768 x 24,576 + 39,518,208 = 844,824,576 -> floor(20.34) = 20
    assert plan.kv_capacity_tokens == 699_050
    assert plan.max_sequences(CTX) == 20
    # vLLM: attention bytes/token/layer 2 x 2 x 256 x 2 = 2048;
    #   block = 16 x ceil(1,097,728 / (16 x 2048)) = 16 x 34 = 544
    # page 544 x 2048 = 1,114,112; groups: 12 full + 36 state -> group size 12 (36 >= 1.5 x 12), 1 + 3 = 4 groups
    # blocks 17,179,869,184 // 1,114,112 // 12 = 1285
    # request: ceil(32768 / 544) = 61 attention blocks + 3 state groups x 2 pages (prefix caching) = 67
    # -> 1285 / 67 = 19.18x; tokens int(19.179 x 32768) = 628,460 (the planner's pool: 699,050)
    view = _vllm(shape, plan.kv_memory_bytes)
    assert (view.block_size, view.page_bytes, view.groups, view.group_size) == (544, 1_114_112, 4, 12)
    assert (view.num_blocks, view.kv_cache_tokens, view.blocks_per_request) == (1285, 628_460, 67)
    assert view.max_concurrency == pytest.approx(1285 / 67)
    # without prefix caching one state page per request: 61 + 3 = 64 -> 20.08x
    lean = vllm_kv_view(layer_specs(shape), plan.kv_memory_bytes, CTX, 16, 8192, prefix_caching=False)
    assert lean is not None and lean.blocks_per_request == 64


def test_deepseek_v2_lite_mla() -> None:
    shape, plan = _plan80(DEEPSEEK_V2_LITE)
    # MLA attention per layer (no q LoRA): q 2048 x 16 x (128+64) = 6,291,456; kv_a 2048 x (512+64) = 1,179,648
    # kv_b 512 x 16 x (128+128) = 2,097,152; o 16 x 128 x 2048 = 4,194,304 -> 13,762,560; x27 = 371,589,120
    # layer 0 dense (first_k_dense_replace 1): 3 x 2048 x 10944 = 67,239,936
    # 26 MoE layers: 64 routed x 3 x 2048 x 1408 (8,650,752) = 553,648,128 -> 14,394,851,328
    #   2 shared x 8,650,752 x 26 = 449,839,104; router 2048 x 64 x 26 = 3,407,872
    # embed + head 2 x 102400 x 2048 = 419,430,400 -> total 15,706,357,760 (DeepSeek: 15.7B)
    assert shape.total_params == 15_706_357_760
    # active: 15,706,357,760 - 14,394,851,328 + 26 x 6 x 8,650,752 = 2,661,023,744
    assert shape.active_params == 2_661_023_744
    assert plan.weight_bytes == 31_412_715_520
    # KV: one latent of 512 + 64 = 576 values x 2 B x 27 layers = 31,104 B/token (not 2 x 16 x 128 x 2 x 27 = 221,184)
    assert shape.kv_bytes_per_token == 31_104
    # 75,161,927,680 - 31,412,715,520 = 43,749,212,160; 32K seq 1,019,215,872 -> floor(42.92) = 42
    assert plan.max_sequences(CTX) == 42
    # vLLM MLA page: 16 x 576 x 2 = 18,432; blocks 43,749,212,160 // 18,432 // 27 = 87,909; 2048 per request
    # -> 42.92x; tokens 87,909 x 16 = 1,406,544
    view = _vllm(shape, plan.kv_memory_bytes)
    assert (view.num_blocks, view.kv_cache_tokens) == (87_909, 1_406_544)
    assert view.max_concurrency == pytest.approx(87_909 / 2048)


def test_deepseek_v3_fp8_mla_fixed_kv_budget() -> None:
    shape = shape_from_hf_config(DEEPSEEK_V3)
    # MLA attention per layer: q 7168 x 1536 + 1536 x 128 x 192 = 48,758,784; kv_a 7168 x 576 = 4,128,768
    #   kv_b 512 x 128 x 256 = 16,777,216; o 128 x 128 x 7168 = 117,440,512 -> 187,105,280; x61 = 11,413,422,080
    # 3 dense layers: 3 x 3 x 7168 x 18432 = 1,189,085,184
    # 58 MoE layers: expert 3 x 7168 x 2048 = 44,040,192; routed 256 x 58 = 653,908,770,816;
    #   shared 1 x 58 = 2,554,331,136
    #   router 7168 x 256 x 58 = 106,430,464; embed + head 2 x 129280 x 7168 = 1,853,358,080
    # total 671,025,397,760 (DeepSeek: 671B without the 14B MTP module, which is not loaded)
    assert shape.total_params == 671_025_397_760
    # active: 671,025,397,760 - 653,908,770,816 + 58 x 8 x 44,040,192 = 37,551,276,032 (DeepSeek: 37B)
    assert shape.active_params == 37_551_276_032
    # FP8 weights: linear layers 11,413,422,080 + 1,189,085,184 + 2,554,331,136 + 653,908,770,816 = 669,065,609,216
    #   x (1 + 4 / (128 x 128)) = 669,065,609,216 + 163,346,096 = 669,228,955,312
    #   router + embeddings in bf16: (106,430,464 + 1,853,358,080) x 2 = 3,919,577,088 -> 673,148,532,400 B (626.9 GiB)
    assert shape.resolved_weight_bytes == 673_148_532_400
    # KV: 61 x 576 x 2 = 70,272 B/token (a per-head K/V reading gives 2 x 61 x 128 x 56 x 2 = 1,748,992: 25x more)
    assert shape.kv_bytes_per_token == 70_272
    plan = plan_fixed_kv(shape, 40)
    # 40 GiB = 42,949,672,960 B; 32K seq = 32768 x 70,272 = 2,302,672,896 -> floor(18.65) = 18
    assert plan.max_sequences(CTX) == 18
    # vLLM: 42,949,672,960 // 18,432 // 61 = 38,199 blocks; 611,184 tokens; 38,199 / 2048 = 18.65x
    view = _vllm(shape, plan.kv_memory_bytes, batched=2048)
    assert (view.num_blocks, view.kv_cache_tokens) == (38_199, 611_184)
    assert view.max_concurrency == pytest.approx(38_199 / 2048)
    assert any("MLA" in note for note in shape.assumptions)
    assert any("MTP" in note for note in shape.assumptions)


def test_kimi_k2_mla_with_more_experts() -> None:
    shape = shape_from_hf_config(KIMI_K2)
    # MLA attention per layer (64 heads): q 7168 x 1536 + 1536 x 64 x 192 = 29,884,416; kv_a 7168 x 576 = 4,128,768
    #   kv_b 512 x 64 x 256 = 8,388,608; o 64 x 128 x 7168 = 58,720,256 -> 101,122,048; x61 = 6,168,444,928
    # 1 dense layer 3 x 7168 x 18432 = 396,361,728; 60 MoE layers: routed 384 x 44,040,192 x 60 = 1,014,686,023,680
    #   shared 44,040,192 x 60 = 2,642,411,520; router 7168 x 384 x 60 = 165,150,720
    # embed + head 2 x 163840 x 7168 = 2,348,810,240 -> total 1,026,407,202,816 (Moonshot: 1T)
    assert shape.total_params == 1_026_407_202_816
    # active: 1,026,407,202,816 - 1,014,686,023,680 + 60 x 8 x 44,040,192 = 32,860,471,296 (Moonshot: 32B)
    assert shape.active_params == 32_860_471_296
    # the latent does not depend on the head count: 61 x 576 x 2 = 70,272 B/token, as DeepSeek-V3
    assert shape.kv_bytes_per_token == 70_272


def test_gemma2_9b_tied_fp32_and_alternating_windows() -> None:
    shape, plan = _plan80(GEMMA2_9B)
    # attention per layer: q 3584 x 16 x 256 + k,v 2 x 3584 x 8 x 256 + o 16 x 256 x 3584 = 44,040,192;
    #   x42 = 1,849,688,064
    # MLP 3 x 3584 x 14336 = 154,140,672; x42 = 6,473,908,224;
    #   embeddings tied (Gemma default): 256000 x 3584 = 917,504,000
    # total 9,241,100,288 (Google: 9.24B); float32 checkpoint served at 16 bits: 18,482,200,576 B (fp32 would be 2x)
    assert shape.total_params == 9_241_100_288
    assert plan.weight_bytes == 18_482_200_576
    assert shape.kv_dtype == "bf16"
    # layers: even ones slide over 4096 tokens -> 21 sliding + 21 full; KV per layer 2 x 8 x 256 x 2 = 8192 B
    assert (shape.sliding_layers, shape.sliding_window, shape.full_layers) == (21, 4096, 21)
    assert shape.kv_bytes_per_token == 42 * 8192
    # 32K seq: 21 x 32768 x 8192 + 21 x 4096 x 8192 = 6,341,787,648 B
    # KV memory 75,161,927,680 - 18,482,200,576 = 56,679,727,104 -> floor(8.94) = 8
    assert plan.sequence_bytes(CTX) == 6_341_787_648
    assert plan.max_sequences(CTX) == 8
    # vLLM: page 16 x 8192 = 131,072; 21 full + 21 sliding -> 2 groups of 21
    # blocks 56,679,727,104 // 131,072 // 21 = 20,592
    # request: full 2048 + sliding ceil(min(4095 + 16384, 32768) / 16) + 1 = 1280 + 1 = 1281 -> 3329
    # 20,592 / 3329 = 6.19x; tokens int(6.1856 x 32768) = 202,691
    view = _vllm(shape, plan.kv_memory_bytes)
    assert (view.groups, view.num_blocks, view.kv_cache_tokens, view.blocks_per_request) == (2, 20_592, 202_691, 3329)
    # 32K is past Gemma-2's native 8192: the report warns (tested in test_plan_cli)
    assert shape.context_length == 8192


def test_gemma3_1b_five_sliding_to_one_global() -> None:
    shape, plan = _plan80(GEMMA3_1B)
    # attention: q 1152 x 4 x 256 + k,v 2 x 1152 x 1 x 256 + o 4 x 256 x 1152 = 2,949,120; x26 = 76,677,120
    # MLP 3 x 1152 x 6912 = 23,887,872; x26 = 621,084,672; tied embeddings 262144 x 1152 = 301,989,888
    # total 999,751,680 (Google: 1B); bf16 1,999,503,360 B
    assert shape.total_params == 999_751_680
    assert plan.weight_bytes == 1_999_503_360
    # global layers at i = 5, 11, 17, 23 -> 4 full, 22 sliding over 512; KV/layer 2 x 1 x 256 x 2 = 1024 B
    assert (shape.full_layers, shape.sliding_layers, shape.sliding_window) == (4, 22, 512)
    # 32K seq: (4 x 32768 + 22 x 512) x 1024 = 145,752,064 B
    # KV memory 75,161,927,680 - 1,999,503,360 = 73,162,424,320 -> floor(501.96) = 501
    assert plan.max_sequences(CTX) == 501
    # vLLM: page 16 x 1024 = 16,384; 4 full / 22 sliding -> group size 4; 1 + ceil(22/4) = 7 groups, 2 padding layers
    # blocks 73,162,424,320 // 16,384 // 4 = 1,116,370
    # request: full 2048 + 6 sliding groups x (ceil(min(511 + 16384, 32768) / 16) + 1 = 1057) = 8390 -> 133.06x
    # tokens int(133.0596 x 32768) = 4,360,096
    view = _vllm(shape, plan.kv_memory_bytes)
    assert (view.groups, view.padding_layers, view.num_blocks) == (7, 2, 1_116_370)
    assert (view.kv_cache_tokens, view.blocks_per_request) == (4_360_096, 8390)
    assert view.max_concurrency == pytest.approx(1_116_370 / 8390)


def test_mistral_7b_sliding_everywhere() -> None:
    shape, plan = _plan80(MISTRAL_7B_V01)
    # attention 41,943,040 x 32 = 1,342,177,280; MLP 176,160,768 x 32 = 5,637,144,576; embed + head 2 x 32000 x 4096
    # = 262,144,000 -> 7,241,465,856 (Mistral: 7.24B); bf16 14,482,931,712 B
    assert shape.total_params == 7_241_465_856
    assert plan.weight_bytes == 14_482_931_712
    assert (shape.sliding_layers, shape.full_layers) == (32, 0)
    # 32K seq: every layer holds 4096 tokens: 32 x 4096 x 4096 B = 536,870,912 B
    # KV memory 75,161,927,680 - 14,482,931,712 = 60,678,995,968 -> floor(113.02) = 113 (full-context reading: 14)
    assert plan.max_sequences(CTX) == 113
    # vLLM: one group of 32 sliding layers; blocks 60,678,995,968 // 65,536 // 32 = 28,934
    # request: ceil(min(4095 + 2 x 8192, 32768) / 16) + 1 = 1280 + 1 = 1281 -> 28,934 / 1281 = 22.59x;
    # tokens int(22.587 x 32768) = 740,132, more than the 462,944 the blocks hold (it counts reservations)
    view = _vllm(shape, plan.kv_memory_bytes)
    assert (view.num_blocks, view.kv_cache_tokens, view.blocks_per_request) == (28_934, 740_132, 1281)
    assert view.max_concurrency == pytest.approx(22.5870, abs=1e-4)
    # one batch in flight (no async scheduling, as on the CPU build): 768 + 1 = 769 -> 37.63x (the "about 38")
    single = vllm_kv_view(layer_specs(shape), plan.kv_memory_bytes, CTX, 16, 8192, concurrent_batches=1)
    assert single is not None and single.max_concurrency == pytest.approx(37.6255, abs=1e-4)


def test_gpt_oss_20b_mxfp4_experts_and_alternating_windows() -> None:
    shape, plan = _plan80(GPT_OSS_20B)
    # attention: q 2880 x 64 x 64 + k,v 2 x 2880 x 8 x 64 + o 64 x 64 x 2880 = 26,542,080; x24 = 637,009,920
    # experts: 32 x 3 x 2880 x 2880 = 796,262,400 per layer; x24 = 19,110,297,600; router 2880 x 32 x 24 = 2,211,840
    # embed + head 2 x 201088 x 2880 = 1,158,266,880 -> total 20,907,786,240 (OpenAI: 20.9B)
    assert shape.total_params == 20_907_786_240
    # weights: experts in MXFP4, 4.25 bits: 19,110,297,600 x 0.53125 = 10,152,345,600
    #   the rest in bf16: (637,009,920 + 2,211,840 + 1,158,266,880) x 2 = 3,594,977,280 -> 13,747,322,880 B (12.80 GiB)
    assert plan.weight_bytes == 13_747_322_880
    # 12 sliding (128) + 12 full; KV/layer 2 x 8 x 64 x 2 = 2048 B; 24 layers -> 49,152 B/token
    assert shape.kv_bytes_per_token == 49_152
    # 32K seq: (12 x 32768 + 12 x 128) x 2048 = 808,452,096
    # KV memory 75,161,927,680 - 13,747,322,880 = 61,414,604,800 -> floor(75.97) = 75
    assert plan.max_sequences(CTX) == 75
    # vLLM: 12 + 12 -> 2 groups of 12; page 32,768; blocks 61,414,604,800 // 32,768 // 12 = 156,185
    # request 2048 + ceil(min(127 + 16384, 32768) / 16) + 1 = 2048 + 1033 = 3081 -> 50.69x
    # tokens int(50.693 x 32768) = 1,661,106
    view = _vllm(shape, plan.kv_memory_bytes)
    assert (view.groups, view.num_blocks, view.kv_cache_tokens, view.blocks_per_request) == (
        2,
        156_185,
        1_661_106,
        3081,
    )
