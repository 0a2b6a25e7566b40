"""Hand-checked capacity arithmetic for a dense model, a MoE and a hybrid-attention model.

Every expected number below is computed by hand in the comment next to it; the code under test is
only ever compared against those literals, never against itself.
"""

from __future__ import annotations

import pytest

from gateway.plan import ModelShape, decode_bound, plan_capacity

GIB = 2**30

# Llama-3-8B: 32 layers, 8 KV heads (GQA), head dim 128, bf16 weights, fp16 KV.
LLAMA3_8B = ModelShape(
    name="llama-3-8b",
    layers=32,
    kv_heads=8,
    head_dim=128,
    kv_dtype="fp16",
    total_params=8.03e9,
    weight_quant="bf16",
)

# Qwen3-30B-A3B: 48 layers, 4 KV heads, head dim 128; 30.5B total, 3.3B active (8 of 128 experts).
QWEN3_30B_A3B = ModelShape(
    name="qwen3-30b-a3b",
    layers=48,
    kv_heads=4,
    head_dim=128,
    kv_dtype="fp16",
    total_params=30.5e9,
    active_params=3.3e9,
    experts=128,
    experts_used=8,
    weight_quant="fp8",
)

# Qwen3.6-35B-A3B (hybrid): 40 layers of which 10 are full attention (2 KV heads x 256), 30 gated
# DeltaNet layers with llama.cpp's float32 state; Q4_K_M file taken as 22 GiB.
QWEN36_35B_A3B = ModelShape(
    name="qwen3.6-35b-a3b",
    layers=40,
    kv_layers=10,
    kv_heads=2,
    head_dim=256,
    kv_dtype="fp16",
    # per DeltaNet layer: conv (4-1) x (4096 + 2x16x128) = 24,576 + recurrent 128 x 4096 = 524,288
    # elements = 548,864 x 4 bytes = 2,195,456 B; x 30 layers = 65,863,680 B (= 62.8125 MiB)
    seq_state_bytes=65_863_680,
    total_params=35e9,
    active_params=3e9,
    experts=256,
    experts_used=8,
    weight_bytes=22 * GIB,
)


def test_dense_llama3_8b() -> None:
    # KV bytes/token = 2 (K,V) x 32 layers x 8 heads x 128 dim x 2 bytes = 131,072
    assert LLAMA3_8B.kv_bytes_per_token == 131_072
    plan = plan_capacity(LLAMA3_8B, gpu_gb=24, util=1.0, overhead_gb=1.0)
    # weights = 8.03e9 params x 16 bits / 8 = 16,060,000,000 B
    assert plan.weight_bytes == 16_060_000_000
    # KV memory = 24 GiB (25,769,803,776) - 16,060,000,000 - 1 GiB (1,073,741,824) = 8,636,061,952
    assert plan.kv_memory_bytes == 8_636_061_952
    assert plan.fits
    # tokens = floor(8,636,061,952 / 131,072) = floor(65,887.92) = 65,887
    # (check: 65,888 x 131,072 = 8,636,071,936, which is 9,984 B too many)
    assert plan.kv_capacity_tokens == 65_887
    # one 8K sequence = 8192 x 131,072 = 1 GiB exactly; floor(8,636,061,952 / 1,073,741,824) = 8
    assert plan.max_sequences(8192) == 8
    # 4K: 0.5 GiB each -> floor(16.08) = 16
    assert plan.max_sequences(4096) == 16
    # inverse: 8 sequences share 8,636,061,952 B -> 1,079,507,744 each -> floor(/131,072) = 8,235 tokens
    assert plan.max_context(8) == 8_235


def test_moe_counts_all_experts_for_memory_and_active_for_reads() -> None:
    # KV bytes/token = 2 x 48 layers x 4 heads x 128 x 2 bytes = 98,304
    assert QWEN3_30B_A3B.kv_bytes_per_token == 98_304
    plan = plan_capacity(QWEN3_30B_A3B, gpu_gb=48, util=0.9, overhead_gb=1.5)
    # memory holds every expert: 30.5e9 params x 8 bits / 8 = 30,500,000,000 B (not the 3.3e9 active)
    assert plan.weight_bytes == 30_500_000_000
    # budget = floor(48 GiB x 0.9) = floor(46,385,646,796.8) = 46,385,646,796
    assert plan.budget_bytes == 46_385_646_796
    # KV memory = 46,385,646,796 - 30,500,000,000 - 1.5 GiB (1,610,612,736) = 14,275,034,060
    assert plan.kv_memory_bytes == 14_275_034_060
    # tokens = floor(14,275,034,060 / 98,304) = floor(145,213.9) = 145,213
    assert plan.kv_capacity_tokens == 145_213
    # 16K sequence = 16,384 x 98,304 = 1,610,612,736 B -> floor(8.86) = 8
    assert plan.max_sequences(16_384) == 8
    # 4K sequence = 402,653,184 B -> floor(35.45) = 35
    assert plan.max_sequences(4096) == 35
    # reads per token: 30.5e9 x 3.3/30.5 = 3.3e9 B of weights
    assert QWEN3_30B_A3B.active_weight_bytes == pytest.approx(3.3e9, rel=1e-9)
    # one stream at 4K on 1000 GB/s: 1e12 / (3.3e9 + 402,653,184) = 270.07 tokens/s
    bound = decode_bound(plan, 1000, 4096, 1)
    assert bound.tokens_per_s == pytest.approx(1e12 / 3_702_653_184)
    assert bound.tokens_per_s == pytest.approx(270.07, abs=0.01)


def test_moe_batch_ceiling_and_uniform_routing_estimate() -> None:
    plan = plan_capacity(QWEN3_30B_A3B, gpu_gb=48, util=0.9, overhead_gb=1.5)
    bound = decode_bound(plan, 1000, 4096, 35)
    # ceiling: 35 x 1e12 / (3.3e9 + 35 x 402,653,184 = 14,092,861,440) = 35e12 / 17,392,861,440 = 2,012.3
    assert bound.tokens_per_s == pytest.approx(35e12 / 17_392_861_440)
    # expert share = (30.5 - 3.3) x 128 / 120 / 30.5 = 0.951257; expert bytes = 29,013,333,333
    # touched = 1 - (1 - 8/128)^35 = 1 - 0.9375^35 = 0.895602; read = 1,486,666,667 + 25,984,450,520
    #         = 27,471,117,187 (+ KV 14,092,861,440) -> 35e12 / 41,563,978,627 = 842.07
    assert bound.uniform_routing_tokens_per_s == pytest.approx(842.07, rel=1e-4)
    assert bound.uniform_routing_tokens_per_s < bound.tokens_per_s


def test_hybrid_qwen36_on_the_articles_cards() -> None:
    # KV bytes/token counts only the 10 full-attention layers: 2 x 10 x 2 heads x 256 x 2 B = 20,480
    assert QWEN36_35B_A3B.kv_bytes_per_token == 20_480
    plan32 = plan_capacity(QWEN36_35B_A3B, gpu_gb=32, util=1.0, overhead_gb=1.5)
    # KV memory = 32 - 22 - 1.5 = 8.5 GiB = 9,126,805,504 B (weights counted once, not twice)
    assert plan32.kv_memory_bytes == 9_126_805_504
    # 4K: 4096 x 20,480 + 65,863,680 = 149,749,760 -> floor(60.95) = 60
    assert plan32.max_sequences(4096) == 60
    # 8K: 167,772,160 + 65,863,680 = 233,635,840 -> floor(39.06) = 39
    assert plan32.max_sequences(8192) == 39
    # 16K: 335,544,320 + 65,863,680 = 401,408,000 -> floor(22.74) = 22
    assert plan32.max_sequences(16_384) == 22
    # 32K: 671,088,640 + 65,863,680 = 736,952,320 -> floor(12.38) = 12
    assert plan32.max_sequences(32_768) == 12
    plan24 = plan_capacity(QWEN36_35B_A3B, gpu_gb=24, util=1.0, overhead_gb=1.5)
    # 24 - 22 - 1.5 = 0.5 GiB = 536,870,912 B: 4K -> floor(3.59) = 3; 32K -> one sequence alone is too big
    assert plan24.max_sequences(4096) == 3
    assert plan24.max_sequences(32_768) == 0
    assert plan24.fits


def test_hybrid_state_is_per_sequence_not_per_token() -> None:
    # Same model without the linear-attention state: 8.5 GiB / (4096 x 20,480 = 83,886,080) = floor(108.8)
    no_state = QWEN36_35B_A3B.override(seq_state_bytes=0)
    assert plan_capacity(no_state, 32, 1.0, 1.5).max_sequences(4096) == 108
    # With it, the 62.8 MiB per sequence costs 48 of those 108 sequences (60 remain, above).
    assert plan_capacity(QWEN36_35B_A3B, 32, 1.0, 1.5).max_sequences(4096) == 60


def test_weights_that_do_not_fit_give_a_verdict_not_negative_headroom() -> None:
    # 24 GiB x 0.9 = 21.6 GiB budget < 22 GiB weights + 1.5 GiB overhead: short by 1.9 GiB
    plan = plan_capacity(QWEN36_35B_A3B, gpu_gb=24, util=0.9, overhead_gb=1.5)
    assert not plan.fits
    assert plan.kv_memory_bytes < 0
    assert plan.kv_capacity_tokens == 0
    assert plan.max_sequences(4096) == 0
    assert plan.max_context(1) == 0
    # budget = floor(25,769,803,776 x 0.9) = floor(23,192,823,398.4) = 23,192,823,398
    # shortfall = 23.5 GiB (25,232,932,864) - 23,192,823,398 = 2,040,109,466 B (1.90 GiB)
    assert plan.shortfall_bytes == 2_040_109_466
    assert plan.verdict.startswith("does not fit")
    assert "1.90 GiB" in plan.verdict


def test_block_rounding_rounds_each_sequence_up_to_whole_blocks() -> None:
    plan = plan_capacity(LLAMA3_8B, gpu_gb=24, util=1.0, overhead_gb=1.0)
    # 1000 tokens in 16-token blocks occupy 1008 tokens: 1008 x 131,072 = 132,120,576 B -> floor(65.37) = 65
    assert plan.sequence_bytes(1000, 16) == 132_120_576
    assert plan.max_sequences(1000, block_tokens=16) == 65
    # unrounded: 131,072,000 B -> floor(65.89) = 65 as well; at 1009 tokens the blocks cost a sequence:
    # 1024 x 131,072 = 134,217,728 -> floor(64.34) = 64, against 1009 x 131,072 -> floor(65.30) = 65
    assert plan.max_sequences(1009, block_tokens=16) == 64
    assert plan.max_sequences(1009) == 65


def test_quantised_kv_rows_are_sized_in_blocks() -> None:
    # q8_0 stores 32 values in 34 bytes: a K row of 8 heads x 128 = 1024 values = 32 blocks = 1088 B,
    # V the same; x 32 layers = 69,632 B/token (vs 131,072 at fp16)
    assert LLAMA3_8B.override(kv_dtype="q8_0").kv_bytes_per_token == 69_632
    # fp8: 1 byte per value -> 2 x 32 x 8 x 128 = 65,536
    assert LLAMA3_8B.override(kv_dtype="fp8").kv_bytes_per_token == 65_536


def test_weight_size_from_quantisation_and_override_order() -> None:
    # q4_k_m at 4.89 bpw: 8.03e9 x 4.89 / 8 = 4,908,337,500 B
    assert LLAMA3_8B.override(weight_quant="q4_k_m").resolved_weight_bytes == 4_908_337_500
    # an explicit size beats the quantisation, and a later quantisation flag drops a file's size
    sized = LLAMA3_8B.override(weight_bytes=5 * GIB)
    assert sized.resolved_weight_bytes == 5 * GIB
    assert sized.override(weight_quant="q8_0").resolved_weight_bytes == int(8.03e9 * 8.5 / 8)
    assert sized.override(source="test", kv_heads=4).sources["kv_heads"] == "test"


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        plan_capacity(LLAMA3_8B, gpu_gb=24, util=1.5)
    with pytest.raises(ValueError):
        plan_capacity(LLAMA3_8B, gpu_gb=0)
    with pytest.raises(ValueError, match="cannot size the weights"):
        plan_capacity(ModelShape(layers=2, kv_heads=1, head_dim=8), gpu_gb=24)
    with pytest.raises(ValueError, match="unknown KV cache dtype"):
        _ = LLAMA3_8B.override(kv_dtype="fp7").kv_bytes_per_token  # the property raises


def test_windowed_layers_cap_per_sequence_memory_and_max_context() -> None:
    # 2 KV layers, 1 head x 8 dims at fp16: one token's row = 2 x 8 x 2 = 32 B per layer
    shape = ModelShape(
        layers=2, kv_heads=1, head_dim=8, kv_dtype="fp16", sliding_layers=1, sliding_window=100, weight_bytes=1
    )
    plan = plan_capacity(shape, gpu_gb=1, util=1.0, overhead_gb=0)
    # KV memory = 1 GiB - 1 B = 1,073,741,823
    # 1000 tokens: full layer 1000 x 32 + sliding layer min(1000, 100) x 32 = 35,200 B
    assert plan.sequence_bytes(1000) == 35_200
    # in 16-token blocks: 1008 x 32 + 112 x 32 = 35,840
    assert plan.sequence_bytes(1000, 16) == 35_840
    # 1,000 sequences share 1,073,741 B each: 32 x L + 3,200 <= 1,073,741 -> L = floor(1,070,541 / 32) = 33,454
    assert plan.max_context(1000) == 33_454
    # with every layer windowed no context is too long: reported as the 16M ceiling
    windowed = shape.override(sliding_layers=2)
    assert plan_capacity(windowed, gpu_gb=1, util=1.0, overhead_gb=0).max_context(1000) == 2**24
