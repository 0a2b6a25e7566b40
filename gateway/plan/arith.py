"""Capacity arithmetic: what is left for the KV cache, and how many sequences it holds.

The whole planner rests on four lines, kept here so they can be read at once:

    budget        = GPU memory x utilisation            (vLLM's --gpu-memory-utilization)
    kv_memory     = budget - weights - overhead         (weights counted once, every expert resident)
    per_sequence  = context x KV bytes/token + state    (state: hybrid linear-attention layers)
    max_sequences = floor(kv_memory / per_sequence)     (0 when kv_memory <= 0: the weights do not fit)

A negative ``kv_memory`` is never presented as capacity: ``fits`` is False and every count is zero.
These are pure functions of dataclasses so the controller can use ``max_sequences`` as a hard cap
when no backend metric reports KV capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.plan.shape import ModelShape
from gateway.plan.units import GIB

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
        """Memory one sequence of ``context_tokens`` takes: its KV, rounded up to whole cache blocks
        (vLLM pages of 16 tokens; llama.cpp cells of 1), plus its fixed linear-attention state."""
        if context_tokens <= 0 or block_tokens <= 0:
            raise ValueError("context and block size must be positive")
        tokens = math.ceil(context_tokens / block_tokens) * block_tokens
        return tokens * self.kv_bytes_per_token + self.seq_state_bytes

    def max_sequences(self, context_tokens: int, block_tokens: int = 1) -> int:
        """Sequences of ``context_tokens`` each (prompt + output) that fit at once."""
        per_sequence = self.sequence_bytes(context_tokens, block_tokens)
        if not self.fits:
            return 0
        if per_sequence == 0:
            raise ValueError("the model has neither KV cache nor per-sequence state: nothing limits sequences")
        return self.kv_memory_bytes // per_sequence

    def max_context(self, sequences: int) -> int:
        """Longest context each of ``sequences`` concurrent sequences may reach (0 if none fits)."""
        if sequences <= 0:
            raise ValueError("sequences must be positive")
        if not self.fits or self.kv_bytes_per_token == 0:
            return 0
        per_sequence = self.kv_memory_bytes // sequences - self.seq_state_bytes
        return max(0, per_sequence // self.kv_bytes_per_token)

    @property
    def verdict(self) -> str:
        gib = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
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
    if gpu_gb <= 0:
        raise ValueError(f"GPU memory must be positive, got {gpu_gb}")
    if not 0 < util <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    if overhead_gb < 0:
        raise ValueError(f"overhead must not be negative, got {overhead_gb}")
    gpu_bytes = int(round(gpu_gb * GIB))
    overhead_bytes = int(round(overhead_gb * GIB))
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
