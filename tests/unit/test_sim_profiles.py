"""Each profile's memory arithmetic, and its throughput curve as the pure model predicts it.

The curves are computed on virtual time (deterministic, not timed), for the default sweep
workload: closed-loop clients sending 512 prompt tokens and reading 512 output tokens.
"""

from __future__ import annotations

import math

import pytest

from gateway.sim.oracle import ClosedLoopPrediction, predict_closed_loop
from gateway.sim.profiles import DEFAULT_PROFILE, LLAMA31_8B_24GB, PROFILES, QWEN36_35B_A3B_32GB, get_profile

LEVELS = [1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 96]
PROMPT, OUTPUT = 512, 512


def curve(name: str) -> dict[int, ClosedLoopPrediction]:
    return {n: predict_closed_loop(PROFILES[name], n, PROMPT, OUTPUT) for n in LEVELS}


@pytest.fixture(scope="module")
def default_curve() -> dict[int, ClosedLoopPrediction]:
    return curve(QWEN36_35B_A3B_32GB.name)


@pytest.fixture(scope="module")
def tight_curve() -> dict[int, ClosedLoopPrediction]:
    return curve(LLAMA31_8B_24GB.name)


def knee(c: dict[int, ClosedLoopPrediction]) -> tuple[float, int, int]:
    """(peak tokens/s, smallest level reaching 90% of it, smallest level with preemptions)."""
    peak = max(p.tokens_per_s for p in c.values())
    n90 = min(n for n, p in c.items() if p.tokens_per_s >= 0.9 * peak)
    cliff = min(n for n, p in c.items() if p.preemptions > 0)
    return peak, n90, cliff


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_kv_capacity_is_derived_from_the_model_and_gpu_shape(name: str) -> None:
    p = PROFILES[name]
    per_token = 2 * p.kv_layers * p.kv_heads * p.head_dim * p.kv_dtype_bytes
    pool = (p.gpu_memory_gib * p.gpu_memory_utilization - p.weights_gib - p.overhead_gib) * 2**30
    assert p.kv_bytes_per_token == per_token
    assert p.num_gpu_blocks == math.floor(pool / (p.block_size * per_token))
    assert p.kv_capacity_tokens == p.num_gpu_blocks * p.block_size
    assert p.weights_gib + p.overhead_gib < p.gpu_memory_gib * p.gpu_memory_utilization  # weights fit
    assert p.blocks_for(p.max_model_len) <= p.num_gpu_blocks  # one full-length sequence fits
    p.validate()


def test_qwen_shape_numbers() -> None:
    p = QWEN36_35B_A3B_32GB
    assert p.kv_bytes_per_token == 20 * 1024  # 10 attention layers x 2 KV heads x 256 x bf16 x (K, V)
    assert p.state_bytes_per_seq == 30 * (2 * 2**20 + 48 * 1024)  # 30 DeltaNet layers, fp32 state + conv
    assert p.state_blocks_per_seq == 197
    assert p.max_concurrency_at(1024) == 49


def test_llama_shape_numbers() -> None:
    p = LLAMA31_8B_24GB
    assert p.kv_bytes_per_token == 128 * 1024  # 32 layers x 8 KV heads x 128 x bf16 x (K, V)
    assert p.state_blocks_per_seq == 0
    assert p.max_concurrency_at(1024) == 38


def test_default_profile_matches_the_article(default_curve: dict[int, ClosedLoopPrediction]) -> None:
    assert QWEN36_35B_A3B_32GB.name == DEFAULT_PROFILE
    one = default_curve[1]
    assert 70 <= one.tokens_per_s <= 80  # ~75 tok/s for a single stream
    assert 1 / one.tpot_mean_s == pytest.approx(75.4, rel=0.03)
    peak, n90, cliff = knee(default_curve)
    assert 1200 <= peak <= 1400  # ~1,300 tok/s
    assert 16 <= n90 <= 32  # the sweet spot the article found
    assert 32 < cliff <= 64  # preemption begins somewhat above it
    assert all(default_curve[n].preemptions == 0 for n in LEVELS if n <= 48)


def test_default_curve_rises_then_flattens_and_latency_explodes_past_the_cliff(
    default_curve: dict[int, ClosedLoopPrediction],
) -> None:
    tps = [default_curve[n].tokens_per_s for n in LEVELS if n <= 48]
    assert tps == sorted(tps)  # more streams never cost throughput below the cliff
    # marginal gain per added stream falls off: the first 8 streams add far more than the last 16
    assert (tps[LEVELS.index(8)] - tps[0]) / 7 > 5 * (
        default_curve[48].tokens_per_s - default_curve[32].tokens_per_s
    ) / 16
    # TPOT grows with the batch (compute-bound), TTFT p99 explodes once requests queue for KV
    assert default_curve[48].tpot_mean_s > 2.5 * default_curve[1].tpot_mean_s
    assert default_curve[96].ttft_p99_s > 20 * default_curve[32].ttft_p99_s
    assert default_curve[96].kv_usage_max == pytest.approx(1.0, abs=0.02)
    assert default_curve[96].tokens_per_s <= max(tps) * 1.01  # no gain past the cliff


def test_tight_kv_profile_hits_the_cliff_before_the_knee(
    default_curve: dict[int, ClosedLoopPrediction], tight_curve: dict[int, ClosedLoopPrediction]
) -> None:
    peak, n90, cliff = knee(tight_curve)
    assert cliff < LLAMA31_8B_24GB.b_knee  # KV runs out while compute still has room
    assert cliff <= n90 + 8  # the cliff sits right at the knee, not well above it
    _, d_n90, d_cliff = knee(default_curve)
    assert cliff / n90 < d_cliff / d_n90
    assert tight_curve[96].tokens_per_s < 0.97 * peak  # recompute waste past the cliff

    def rate(c: ClosedLoopPrediction) -> float:
        return c.preemptions / c.window_s

    assert rate(tight_curve[96]) > 2 * rate(tight_curve[48]) > 0  # thrashing grows with the overload


def test_prediction_at_one_stream_is_the_step_time_model() -> None:
    p = LLAMA31_8B_24GB
    r = predict_closed_loop(p, 1, 100, 50, measure_requests=2)
    # TTFT = one prefill step; TPOT = decode steps over a context growing from 100 to 149 tokens
    assert r.ttft_mean_s == pytest.approx(p.step_time(0, 100, 100))
    mean_decode = sum(p.step_time(1, 0, 100 + i) for i in range(1, 50)) / 49
    assert r.tpot_mean_s == pytest.approx(mean_decode)
    assert r.tokens_per_s == pytest.approx(50 / (r.ttft_mean_s + 49 * r.tpot_mean_s), rel=1e-6)
    assert r.preemptions == 0


def test_think_time_and_speed_factor_lower_the_prediction() -> None:
    p = QWEN36_35B_A3B_32GB
    base = predict_closed_loop(p, 8, 256, 128)
    assert predict_closed_loop(p, 8, 256, 128, speed_factor=2.0).tokens_per_s == pytest.approx(
        base.tokens_per_s / 2, rel=1e-6
    )
    assert predict_closed_loop(p, 8, 256, 128, think_time_s=1.0).tokens_per_s < 0.8 * base.tokens_per_s


def test_unknown_profile_names_list_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"llama3\.1-8b-24gb"):
        get_profile("nope")


# --- the range (issue 38): each profile against the published figure it cites (docs/simulator.md) -----------
# NVIDIA NIM LLM benchmarking, Llama-3.1-8B-Instruct, NIM 1.8.0: inter-token latency (ms) by concurrency.
NIM_8B_ITL_MS = {1: 4.63, 50: 5.91, 100: 7.57, 150: 9.81, 200: 12.65, 250: 16.14}
# NVIDIA NIM, Llama-3.3-70B-Instruct, NIM 1.8.0, 2 x H100 80G, fp8 TP2, 5,000 input / 500 output tokens:
# concurrency -> (ITL ms, output tokens/s).
NIM_70B_5000_500 = {1: (18.58, 51.67), 5: (21.83, 218.48), 25: (38.75, 623.4), 50: (59.73, 814.37)}
NIM_70B_SATURATED = 917.26  # tokens/s at 100 streams (TTFT 8.0 s: requests queue for the KV cache)
# Mistral-7B-Instruct-v0.3 on an RTX 4090 under vLLM, 256 input / 128 output tokens: streams -> output tok/s.
MISTRAL_4090 = {4: 210, 8: 377, 16: 644, 32: 975, 48: 1190}


def test_8b_h100_step_time_matches_nims_inter_token_latency() -> None:
    p = get_profile("llama3.1-8b-fp8-h100")
    for streams, itl_ms in NIM_8B_ITL_MS.items():
        # each stream holds about a thousand tokens of context
        assert p.step_time(streams, 0, streams * 1100) * 1000 == pytest.approx(itl_ms, rel=0.08), streams
    one = predict_closed_loop(p, 1, 256, 256, measure_requests=2)
    assert 1 / one.tpot_mean_s == pytest.approx(214.56, rel=0.03)  # NIM: 214.56 tok/s for one stream


def test_8b_h100_memory_and_knee_in_the_hundreds() -> None:
    p = get_profile("llama3.1-8b-fp8-h100")
    assert p.kv_bytes_per_token == 128 * 1024  # 2 x 32 layers x 8 KV heads x 128 x bf16
    assert p.max_concurrency_at(1024) > p.max_num_seqs  # the cache never binds for chat: the knee is compute
    # throughput still grows by more than 10% from 100 to 200 streams (NIM: 12,215 -> 13,348 tok/s)
    assert 200 / p.step_time(200) > 1.1 * 100 / p.step_time(100)


def test_70b_tp2_matches_nims_long_prompt_curve() -> None:
    p = get_profile("llama3.3-70b-fp8-2xh100")
    assert p.kv_bytes_per_token == 160 * 1024  # 2 x 80 layers x 8 KV heads x 128 x fp8
    assert p.max_concurrency_at(5500) == 84  # where NIM's throughput stops growing
    for streams, (itl_ms, tokens_per_s) in NIM_70B_5000_500.items():
        r = predict_closed_loop(p, streams, 5000, 500, measure_requests=1)
        assert r.tpot_mean_s * 1000 == pytest.approx(itl_ms, rel=0.08), streams
        assert r.tokens_per_s == pytest.approx(tokens_per_s, rel=0.1), streams
    saturated = predict_closed_loop(p, 100, 5000, 500, measure_requests=1)
    assert saturated.tokens_per_s == pytest.approx(NIM_70B_SATURATED, rel=0.15)
    assert saturated.ttft_mean_s > 5.0  # NIM: 8.0 s, queued for the cache
    reasoning = predict_closed_loop(p, 1, 500, 2000, measure_requests=1)
    assert reasoning.tpot_mean_s * 1000 == pytest.approx(18.91, rel=0.05)  # NIM, 500 in / 2,000 out


def test_8b_awq_16gb_single_stream_matches_the_published_figure() -> None:
    p = get_profile("llama3-8b-awq-16gb")
    assert p.max_concurrency_at(1024) == 60
    one = predict_closed_loop(p, 1, 512, 256, measure_requests=2)
    assert 1 / one.tpot_mean_s == pytest.approx(43, rel=0.03)  # AWQ 4-bit on an RTX 4060 Ti 16 GB


def test_rag_24gb_decode_matches_the_published_sweep_and_holds_three_32k_contexts() -> None:
    p = get_profile("mistral-7b-rag-24gb")
    assert p.kv_bytes_per_token == 64 * 1024  # 2 x 32 layers x 8 KV heads x 128 x fp8
    assert p.max_concurrency_at(32768) == 3
    for streams, tokens_per_s in MISTRAL_4090.items():
        r = predict_closed_loop(p, streams, 256, 128, measure_requests=2)
        assert r.tokens_per_s == pytest.approx(tokens_per_s, rel=0.08), streams
    # past three 30K-token contexts the cache thrashes
    assert predict_closed_loop(p, 4, 30000, 256, measure_requests=1).preemptions > 0
