"""Calibrated hardware/model profiles for the simulator.

A profile is everything the engine needs to behave like one model on one GPU: the step-time
model (how long one continuous-batching step takes) and the memory shape (how many KV-cache
blocks fit). The memory side is *derived* from a model/GPU shape rather than typed in, so the
capacity planner (``gateway/plan/``) can recompute it from the same fields and a test can
check that both agree.

Memory arithmetic (all sizes in GiB = 2**30 bytes; vLLM's own profiling does the same):

    kv_bytes_per_token = 2 (K and V) x kv_layers x kv_heads x head_dim x kv_dtype_bytes
    kv_pool_bytes      = (gpu_memory_gib x gpu_memory_utilization - weights_gib - overhead_gib) x 2**30
    num_gpu_blocks     = floor(kv_pool_bytes / (block_size x kv_bytes_per_token))
    kv_capacity_tokens = num_gpu_blocks x block_size

Hybrid models (Gated DeltaNet + attention, as Qwen3.5/3.6) also keep a fixed-size recurrent
state per *sequence* for their linear-attention layers. vLLM's hybrid allocator takes that
state from the same block pool, so here every running sequence holds
``state_blocks_per_seq = ceil(state_bytes_per_seq / block_bytes)`` blocks on top of its KV
blocks. ``state_bytes_per_seq = linear_layers x linear_state_bytes_per_layer``.

Step-time model (seconds), for a step that decodes ``b`` sequences, prefills ``p`` prompt
tokens and attends over ``k`` cached tokens in total:

    step = t_floor x (1 + (b / b_knee) ** knee_sharpness) ** (1 / knee_sharpness)
           + prefill_s_per_token x p + attn_s_per_kv_token x k

The first term is flat while the step is memory-bound (reading the weights costs the same for
one sequence or ten) and turns linear in ``b`` once it is compute-bound; ``b_knee`` is where the
two asymptotes cross and ``knee_sharpness`` how abruptly. The attention term is what makes long
contexts slower; the prefill term is what makes new requests cost the batch a hiccup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True, slots=True)
class Profile:
    """One model on one GPU. Frozen: scenario changes live on the engine, not here."""

    name: str
    model: str  # default served model name
    description: str
    # --- step-time model ---
    t_floor_s: float  # one memory-bound decode step (weights read once), seconds
    b_knee: float  # batch size where memory-bound and compute-bound asymptotes cross
    knee_sharpness: float  # p in the soft maximum; larger = sharper knee
    prefill_s_per_token: float  # marginal cost of one prompt token in a step
    attn_s_per_kv_token: float  # marginal cost of one cached token attended to in a step
    # --- scheduler ---
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    # --- memory shape (the KV capacity is derived from these) ---
    gpu_name: str
    gpu_memory_gib: float
    gpu_memory_utilization: float
    weights_gib: float
    overhead_gib: float  # activations at the profiling batch, CUDA graphs, non-torch allocations
    kv_layers: int  # layers that keep a KV cache (full-attention layers)
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    linear_layers: int = 0  # linear-attention (recurrent) layers of a hybrid model
    linear_state_bytes_per_layer: int = 0  # recurrent + conv state of one sequence in one layer
    kv_cache_dtype: str = "auto"
    embedding_dim: int = 1024

    # ----- derived memory quantities -----
    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.kv_layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.kv_bytes_per_token

    @property
    def kv_pool_bytes(self) -> int:
        gib = self.gpu_memory_gib * self.gpu_memory_utilization - self.weights_gib - self.overhead_gib
        return int(gib * GIB)

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_pool_bytes // self.block_bytes

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def state_bytes_per_seq(self) -> int:
        return self.linear_layers * self.linear_state_bytes_per_layer

    @property
    def state_blocks_per_seq(self) -> int:
        return math.ceil(self.state_bytes_per_seq / self.block_bytes) if self.state_bytes_per_seq else 0

    def blocks_for(self, tokens: int) -> int:
        """Blocks one sequence holds with ``tokens`` tokens cached (state included)."""
        return self.state_blocks_per_seq + -(-tokens // self.block_size)

    def max_concurrency_at(self, tokens_per_seq: int) -> int:
        """How many sequences of ``tokens_per_seq`` cached tokens fit in the pool at once."""
        return self.num_gpu_blocks // self.blocks_for(tokens_per_seq)

    # ----- step-time model -----
    def decode_factor(self, batch: int) -> float:
        """Soft maximum of the memory-bound floor (1) and the compute-bound line (b / b_knee)."""
        p = self.knee_sharpness
        return (1.0 + (batch / self.b_knee) ** p) ** (1.0 / p)

    def step_time(self, decode_seqs: int, prefill_tokens: int = 0, kv_tokens: int = 0) -> float:
        return (
            self.t_floor_s * self.decode_factor(decode_seqs)
            + self.prefill_s_per_token * prefill_tokens
            + self.attn_s_per_kv_token * kv_tokens
        )

    def validate(self) -> None:
        """Refuse shapes that could not run: weights that do not fit, a context that does not fit."""
        usable = self.gpu_memory_gib * self.gpu_memory_utilization
        if self.weights_gib + self.overhead_gib >= usable:
            raise ValueError(f"profile {self.name}: weights + overhead exceed the usable GPU memory")
        if self.blocks_for(self.max_model_len) > self.num_gpu_blocks:
            raise ValueError(f"profile {self.name}: one max_model_len sequence does not fit the KV pool")


# Qwen3.6-35B-A3B (qwen3_5_moe): 40 layers = 30 Gated DeltaNet + 10 gated-attention layers,
# attention with 2 KV heads of dim 256; linear attention with 16 key / 32 value heads of dim 128,
# conv kernel 4, recurrent state kept in float32 (``mamba_ssm_dtype``). Per sequence and linear
# layer: SSM state 32 x 128 x 128 x 4 B = 2 MiB, conv state 3 x (2 x 16 x 128 + 32 x 128) x 2 B
# = 48 KiB. KV per token: 2 x 10 x 2 x 256 x 2 B = 20 KiB. The card is a 32 GB RTX 5090
# (32,607 MiB = 31.84 GiB). Weights: the article's ~22 GB 4-bit file (20.5 GiB) plus the ~0.9 GiB
# bf16 vision tower vLLM also loads = 21.4 GiB. Overhead (3.3 GiB: activation peak of the
# profiling batch for a 256-expert MoE, CUDA graphs, non-torch allocations, allocator slack) is
# an estimate, not a measurement. That leaves 3.96 GiB = 12,963 blocks of 16 tokens (320 KiB);
# each sequence holds 197 blocks of recurrent state plus its KV blocks, so 49 sequences of
# 1,024 tokens fit - preemption starts between 48 and 56 concurrent 512+512 requests.
QWEN36_35B_A3B_32GB = Profile(
    name="qwen3.6-35b-a3b-32gb",
    model="Qwen/Qwen3.6-35B-A3B",
    description=(
        "Qwen3.6-35B-A3B (hybrid MoE, 3B active), 4-bit, on a 32 GB card; calibrated to the article: "
        "~75 tok/s for one stream, ~1,300 tok/s peak, knee at 16-32 concurrent streams"
    ),
    t_floor_s=0.01318,
    b_knee=20.2,
    knee_sharpness=3.0,
    prefill_s_per_token=0.00008,
    attn_s_per_kv_token=3.0e-8,
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    max_model_len=4096,
    block_size=16,
    gpu_name="NVIDIA GeForce RTX 5090",
    gpu_memory_gib=31.84,
    gpu_memory_utilization=0.90,
    weights_gib=21.4,
    overhead_gib=3.3,
    kv_layers=10,
    kv_heads=2,
    head_dim=256,
    kv_dtype_bytes=2,
    linear_layers=30,
    linear_state_bytes_per_layer=32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * 2,
    embedding_dim=2048,
)

# Llama-3.1-8B-Instruct in bf16 on a 24 GB RTX 4090 (24,564 MiB = 23.99 GiB): 32 layers, 8 KV
# heads of dim 128, so 128 KiB of KV per token. The 16 GB of weights (8.03e9 x 2 B = 14.96 GiB)
# and 1.8 GiB of overhead leave 4.83 GiB = 2,473 blocks of 16 tokens (2 MiB) = 39,568 tokens: at
# 1K tokens per request the cache is full at 38 concurrent streams, before the compute knee
# (b_knee = 48) - the tight-KV case, where the sweet spot is set by memory, not by throughput.
LLAMA31_8B_24GB = Profile(
    name="llama3.1-8b-24gb",
    model="meta-llama/Llama-3.1-8B-Instruct",
    description=(
        "Llama-3.1-8B-Instruct, bf16, on a 24 GB card: KV cache is tight, so preemption (the cliff) "
        "comes before the throughput knee"
    ),
    t_floor_s=0.0175,
    b_knee=48.0,
    knee_sharpness=2.5,
    prefill_s_per_token=0.00012,
    attn_s_per_kv_token=1.6e-7,
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    max_model_len=8192,
    block_size=16,
    gpu_name="NVIDIA GeForce RTX 4090",
    gpu_memory_gib=23.99,
    gpu_memory_utilization=0.90,
    weights_gib=14.96,
    overhead_gib=1.8,
    kv_layers=32,
    kv_heads=8,
    head_dim=128,
    kv_dtype_bytes=2,
    embedding_dim=4096,
)

# The range (issue 38): each profile below is calibrated to a published serving measurement, cited with
# its figures in docs/simulator.md. GPU memory in GiB as the driver reports it: H100 SXM 80 GB = 81,559
# MiB = 79.65 GiB; RTX 4090 = 24,564 MiB = 23.99 GiB; RTX 4060 Ti 16 GB = 16,380 MiB = 16.00 GiB.

# Llama-3.1-8B-Instruct, FP8 weights (NVIDIA's FP8 checkpoint: 6.9e9 B of fp8 linear weights plus the bf16
# embedding and LM head, 2 x 128,256 x 4,096 x 2 B = 2.1e9 B; 9.0e9 B = 8.4 GiB) on one H100 80 GB. KV in
# bf16: 2 x 32 layers x 8 KV heads x 128 x 2 B = 128 KiB/token. 79.65 x 0.90 - 8.4 - 4.0 = 59.29 GiB =
# 30,356 blocks of 16 tokens = 485,696 tokens: 474 sequences of 1,024 tokens, so at vLLM's
# max_num_seqs of 256 the KV cache never binds for chat. The step time is fitted to NVIDIA NIM's inter-token
# latencies for this model (4.63 ms at 1 stream, 7.57 at 100, 12.65 at 200): a soft knee (s = 2) at 79.
LLAMA31_8B_FP8_H100 = Profile(
    name="llama3.1-8b-fp8-h100",
    model="meta-llama/Llama-3.1-8B-Instruct",
    description=(
        "Llama-3.1-8B-Instruct, FP8, on one H100 80 GB: short chats, the knee in the hundreds (NVIDIA NIM's "
        "published curve: 215 tok/s for one stream, 13,348 tok/s at 200)"
    ),
    t_floor_s=0.00463,
    b_knee=79.0,
    knee_sharpness=2.0,
    prefill_s_per_token=0.000025,
    attn_s_per_kv_token=1.0e-9,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=8192,
    block_size=16,
    gpu_name="NVIDIA H100 80GB HBM3",
    gpu_memory_gib=79.65,
    gpu_memory_utilization=0.90,
    weights_gib=8.4,
    overhead_gib=4.0,
    kv_layers=32,
    kv_heads=8,
    head_dim=128,
    kv_dtype_bytes=2,
    embedding_dim=4096,
)

# Llama-3.3-70B-Instruct, FP8 weights and FP8 KV cache, tensor parallel over two H100 80 GB (the memory of
# both cards is one pool: each holds half the KV heads of every layer). Weights: 68.4e9 fp8 parameters plus
# the bf16 embedding and LM head (2 x 128,256 x 8,192 x 2 B = 4.2e9 B): 72.6e9 B = 67.6 GiB. KV: 2 x 80
# layers x 8 KV heads x 128 x 1 B = 160 KiB/token. 2 x 79.65 x 0.90 - 67.6 - 5.0 (2.5 per card) = 70.77
# GiB = 28,985 blocks = 463,760 tokens: 84 sequences of NIM's 5,000 + 500 tokens, where NIM's published
# throughput stops growing (917 tok/s at 100 streams, 920 at 150-250, TTFT climbing from 0.8 s to 8 s).
LLAMA33_70B_FP8_2XH100 = Profile(
    name="llama3.3-70b-fp8-2xh100",
    model="meta-llama/Llama-3.3-70B-Instruct",
    description=(
        "Llama-3.3-70B-Instruct, FP8 weights and KV cache, tensor parallel on two H100 80 GB: long prompts or "
        "long answers (NVIDIA NIM's published curve: 52 tok/s for one stream, ~920 tok/s at 5,000 + 500 tokens)"
    ),
    t_floor_s=0.0182,
    b_knee=60.0,
    knee_sharpness=2.0,
    prefill_s_per_token=0.00007,
    attn_s_per_kv_token=3.0e-9,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=16384,
    block_size=16,
    gpu_name="2 x NVIDIA H100 80GB HBM3 (TP 2)",
    gpu_memory_gib=2 * 79.65,
    gpu_memory_utilization=0.90,
    weights_gib=67.6,
    overhead_gib=5.0,
    kv_layers=80,
    kv_heads=8,
    head_dim=128,
    kv_dtype_bytes=1,
    kv_cache_dtype="fp8",
    embedding_dim=8192,
)

# Llama-3-8B-Instruct, AWQ 4-bit, on a 16 GB RTX 4060 Ti (288 GB/s). Weights: 4-bit linear layers plus the
# fp16 embedding and LM head, 5.7e9 B = 5.3 GiB. KV in fp16: 128 KiB/token. 16.00 x 0.90 - 5.3 - 1.5 =
# 7.6 GiB = 3,891 blocks = 62,256 tokens: 60 sequences of 1,024 tokens. One stream decodes at the 43 tok/s
# a published vLLM benchmark measured for AWQ on this card (23.3 ms a step: 5.7 GB at 288 GB/s is 19.8 ms,
# plus kernel overhead). The compute knee (b_knee 20) is an estimate: AWQ's dequantising kernels on a card
# with a quarter of a 4090's tensor throughput turn compute-bound early.
LLAMA3_8B_AWQ_16GB = Profile(
    name="llama3-8b-awq-16gb",
    model="meta-llama/Meta-Llama-3-8B-Instruct",
    description=(
        "Llama-3-8B-Instruct, AWQ 4-bit, on a 16 GB RTX 4060 Ti: a small card, the knee in the tens "
        "(43 tok/s for one stream, published)"
    ),
    t_floor_s=0.0233,
    b_knee=20.0,
    knee_sharpness=2.5,
    prefill_s_per_token=0.00025,
    attn_s_per_kv_token=2.0e-7,
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    max_model_len=8192,
    block_size=16,
    gpu_name="NVIDIA GeForce RTX 4060 Ti 16GB",
    gpu_memory_gib=16.00,
    gpu_memory_utilization=0.90,
    weights_gib=5.3,
    overhead_gib=1.5,
    kv_layers=32,
    kv_heads=8,
    head_dim=128,
    kv_dtype_bytes=2,
    embedding_dim=4096,
)

# Mistral-7B-Instruct-v0.3 (32K context) in bf16 with an FP8 KV cache on a 24 GB RTX 4090, for RAG over
# 32K-token contexts. Weights 7.248e9 x 2 B = 13.5 GiB; KV: 2 x 32 layers x 8 KV heads x 128 x 1 B = 64
# KiB/token. 23.99 x 0.90 - 13.5 - 1.5 = 6.59 GiB = 6,748 blocks of 1 MiB = 107,968 tokens: three sequences
# of 32K tokens. The decode step is fitted to a published vLLM sweep of this model on this card (256 + 128
# tokens: 210 tok/s at 4 streams, 644 at 16, 1,190 at 48); prefill (8,300 tok/s) and attention are derived
# from the card's bf16 throughput and bandwidth, not measured.
MISTRAL7B_RAG_24GB = Profile(
    name="mistral-7b-rag-24gb",
    model="mistralai/Mistral-7B-Instruct-v0.3",
    description=(
        "Mistral-7B-Instruct-v0.3, bf16 with an FP8 KV cache, on a 24 GB RTX 4090, 32K-token RAG: "
        "KV-bound, a knee of a handful"
    ),
    t_floor_s=0.018,
    b_knee=40.0,
    knee_sharpness=2.0,
    prefill_s_per_token=0.00012,
    attn_s_per_kv_token=6.0e-8,
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    max_model_len=32768,
    block_size=16,
    gpu_name="NVIDIA GeForce RTX 4090",
    gpu_memory_gib=23.99,
    gpu_memory_utilization=0.90,
    weights_gib=13.5,
    overhead_gib=1.5,
    kv_layers=32,
    kv_heads=8,
    head_dim=128,
    kv_dtype_bytes=1,
    kv_cache_dtype="fp8",
    embedding_dim=4096,
)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        QWEN36_35B_A3B_32GB,
        LLAMA31_8B_24GB,
        LLAMA31_8B_FP8_H100,
        LLAMA33_70B_FP8_2XH100,
        LLAMA3_8B_AWQ_16GB,
        MISTRAL7B_RAG_24GB,
    )
}
DEFAULT_PROFILE = QWEN36_35B_A3B_32GB.name


def get_profile(name: str) -> Profile:
    """Look a profile up by name; the error lists the names that exist."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown simulator profile {name!r}; known profiles: {known}") from None
