"""Upper bound on decode speed from memory bandwidth.

Decoding is memory-bound: every step reads the weights the batch's tokens route through plus each
sequence's KV cache (and linear-attention state). So for a batch of B sequences at context L,

    bytes per step >= active weight bytes + B x (L x KV bytes/token + state)
    tokens/s       <= B x bandwidth / bytes per step

That is a true ceiling (it assumes perfect bandwidth and that the batch shares one set of active
weights). For a MoE the batch's tokens route to different experts, so more than the active set is read;
``uniform_routing_tokens_per_s`` estimates that with the expected number of distinct experts under
uniform routing, E x (1 - (1 - k/E)^B). Real routers are skewed, so the truth lies between the two.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.plan.arith import CapacityPlan
from gateway.plan.units import GB_PER_S


@dataclass(frozen=True)
class DecodeBound:
    bandwidth_gbs: float
    context_tokens: int
    batch: int
    weight_bytes_read: int  # lower bound per step: the active set, read once for the batch
    kv_bytes_read: int  # per step, all sequences
    tokens_per_s: float  # aggregate ceiling over the batch
    uniform_routing_tokens_per_s: float | None  # MoE estimate with uniformly routed experts

    @property
    def per_stream_tokens_per_s(self) -> float:
        return self.tokens_per_s / self.batch


def decode_bound(plan: CapacityPlan, bandwidth_gbs: float, context_tokens: int, batch: int = 1) -> DecodeBound:
    """Ceiling on decode tokens/s for ``batch`` sequences at ``context_tokens`` on ``bandwidth_gbs`` GB/s."""
    if bandwidth_gbs <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_gbs}")
    if batch <= 0 or context_tokens <= 0:
        raise ValueError("batch and context must be positive")
    shape = plan.shape
    bandwidth = bandwidth_gbs * GB_PER_S
    kv_read = batch * (context_tokens * plan.kv_bytes_per_token + plan.seq_state_bytes)
    weights_read = shape.active_weight_bytes
    ceiling = batch * bandwidth / (weights_read + kv_read)

    uniform = None
    expert_share = shape.expert_fraction
    if expert_share is not None and shape.experts and shape.experts_used:
        expert_bytes = plan.weight_bytes * expert_share
        touched = 1.0 - (1.0 - shape.experts_used / shape.experts) ** batch
        uniform_read = plan.weight_bytes - expert_bytes + expert_bytes * touched
        uniform = batch * bandwidth / (uniform_read + kv_read)
    return DecodeBound(
        bandwidth_gbs=bandwidth_gbs,
        context_tokens=context_tokens,
        batch=batch,
        weight_bytes_read=weights_read,
        kv_bytes_read=kv_read,
        tokens_per_s=ceiling,
        uniform_routing_tokens_per_s=uniform,
    )
