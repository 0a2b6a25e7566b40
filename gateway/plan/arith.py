"""Capacity arithmetic: what is left for the KV cache, and how many sequences it holds.

The whole planner rests on four lines, kept here so they can be read at once:

    budget        = GPU memory x utilisation            (vLLM's --gpu-memory-utilization)
    kv_memory     = budget - weights - overhead         (weights counted once, every expert resident)
    per_sequence  = KV of each layer + state            (a full layer holds the context, a sliding or
                                                         chunked layer at most its window; state: hybrid
                                                         linear-attention layers)
    max_sequences = floor(kv_memory / per_sequence)     (0 when kv_memory <= 0: the weights do not fit)

With a fixed KV budget (``plan_fixed_kv``, as vLLM's ``--kv-cache-memory-bytes`` or
``VLLM_CPU_KVCACHE_SPACE`` give one) the first two lines are skipped: kv_memory is the budget.

A negative ``kv_memory`` is never presented as capacity: ``fits`` is False and every count is zero.
These are pure functions of dataclasses so the controller can use ``max_sequences`` as a hard cap
when no backend metric reports KV capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.plan.shape import ModelShape
from gateway.plan.units import GIB, MAX_CONTEXT_TOKENS

DEFAULT_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
DEFAULT_OVERHEAD_GB = 1.5  # CUDA context, activations, CUDA graphs: measure yours, this is a guess


@dataclass(frozen=True)
class CapacityPlan:
    """Memory budget of one model on one GPU, and the sequences it can hold."""

    shape: ModelShape
    gpu_bytes: int
    utilization: float
    overhead_bytes: int
    budget_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    seq_state_bytes: int
    kv_memory_bytes: int  # may be <= 0; then fits is False
    fixed_kv: bool = False  # kv_memory_bytes was given, not derived from a GPU

    @property
    def fits(self) -> bool:
        return self.kv_memory_bytes > 0

    @property
    def shortfall_bytes(self) -> int:
        """How much memory is missing before a single KV byte fits (0 when it fits)."""
        return 0 if self.fits else -self.kv_memory_bytes

    @property
    def kv_capacity_tokens(self) -> int | None:
        """Tokens of KV cache the free memory holds, before any per-sequence state (0 if nothing fits;
        None for a model with no per-token KV at all, whose limit is the state count alone)."""
        if not self.fits:
            return 0
        if self.kv_bytes_per_token == 0:
            return None
        return self.kv_memory_bytes // self.kv_bytes_per_token

    def sequence_bytes(self, context_tokens: int, block_tokens: int = 1) -> int:
        """Memory one sequence of ``context_tokens`` takes: its KV (windowed layers capped at their
        window), rounded up to whole cache blocks (vLLM pages of 16 tokens; llama.cpp cells of 1), plus
        its fixed linear-attention state."""
        if context_tokens <= 0 or block_tokens <= 0:
            raise ValueError("context and block size must be positive")
        return self.shape.sequence_kv_bytes(context_tokens, block_tokens) + self.seq_state_bytes

    def max_sequences(self, context_tokens: int, block_tokens: int = 1) -> int:
        """Sequences of ``context_tokens`` each (prompt + output) that fit at once."""
        per_sequence = self.sequence_bytes(context_tokens, block_tokens)
        if not self.fits:
            return 0
        if per_sequence == 0:
            raise ValueError("the model has neither KV cache nor per-sequence state: nothing limits sequences")
        return self.kv_memory_bytes // per_sequence

    def max_context(self, sequences: int) -> int:
        """Longest context each of ``sequences`` concurrent sequences may reach (0 if none fits); a
        model whose every layer is windowed has no limit, reported as ``MAX_CONTEXT_TOKENS``."""
        if sequences <= 0:
            raise ValueError("sequences must be positive")
        if not self.fits or self.kv_bytes_per_token == 0:
            return 0
        share = self.kv_memory_bytes // sequences
        if self.sequence_bytes(1) > share:
            return 0
        # sequence_bytes grows with the context (flat once every window is full): search for the edge
        low, high = 1, 1
        while self.sequence_bytes(high) <= share:
            if high >= MAX_CONTEXT_TOKENS:
                return MAX_CONTEXT_TOKENS
            low, high = high, high * 2
        while high - low > 1:
            mid = (low + high) // 2
            if self.sequence_bytes(mid) <= share:
                low = mid
            else:
                high = mid
        return low

    @property
    def verdict(self) -> str:
        gib = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
        if self.fixed_kv:
            return f"fixed KV budget: {gib(self.kv_memory_bytes)}"
        if not self.fits:
            return (
                f"does not fit: weights {gib(self.weight_bytes)} + overhead {gib(self.overhead_bytes)} "
                f"exceed the {gib(self.budget_bytes)} budget by {gib(self.shortfall_bytes)}"
            )
        return f"fits: {gib(self.kv_memory_bytes)} left for KV cache"


def plan_capacity(
    shape: ModelShape,
    gpu_gb: float,
    util: float = DEFAULT_UTILIZATION,
    overhead_gb: float = DEFAULT_OVERHEAD_GB,
) -> CapacityPlan:
    """Plan one model on one GPU of ``gpu_gb`` GiB, of which the engine may use ``util`` (0-1]."""
    if not math.isfinite(gpu_gb) or gpu_gb <= 0:
        raise ValueError(f"--gpu-gb must be a positive finite number, got {gpu_gb}")
    if not math.isfinite(util) or not 0 < util <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    if not math.isfinite(overhead_gb) or overhead_gb < 0:
        raise ValueError(f"--overhead-gb must be a finite number >= 0, got {overhead_gb}")
    gpu_bytes = round(gpu_gb * GIB)
    overhead_bytes = round(overhead_gb * GIB)
    budget = int(gpu_bytes * util)
    weights = shape.resolved_weight_bytes
    return CapacityPlan(
        shape=shape,
        gpu_bytes=gpu_bytes,
        utilization=util,
        overhead_bytes=overhead_bytes,
        budget_bytes=budget,
        weight_bytes=weights,
        kv_bytes_per_token=shape.kv_bytes_per_token,
        seq_state_bytes=shape.seq_state_bytes,
        kv_memory_bytes=budget - weights - overhead_bytes,
    )


def plan_fixed_kv(shape: ModelShape, kv_cache_gb: float) -> CapacityPlan:
    """Plan a KV budget given directly (``--kv-cache-gb``): no GPU, weights or overhead enter it, the way
    vLLM sizes its cache from ``--kv-cache-memory-bytes`` or ``VLLM_CPU_KVCACHE_SPACE``."""
    if not math.isfinite(kv_cache_gb) or kv_cache_gb <= 0:
        raise ValueError(f"--kv-cache-gb must be a positive finite number, got {kv_cache_gb}")
    kv_bytes = round(kv_cache_gb * GIB)
    try:
        weights = shape.resolved_weight_bytes
    except ValueError:
        weights = 0  # not needed for a fixed budget; the report shows the weights only when known
    return CapacityPlan(
        shape=shape,
        gpu_bytes=0,
        utilization=1.0,
        overhead_bytes=0,
        budget_bytes=kv_bytes,
        weight_bytes=weights,
        kv_bytes_per_token=shape.kv_bytes_per_token,
        seq_state_bytes=shape.seq_state_bytes,
        kv_memory_bytes=kv_bytes,
        fixed_kv=True,
    )
