"""The planner and the simulator must agree on KV capacity and on where preemption begins.

Each simulator profile records its model/GPU memory shape (KV layers, heads, head dim, dtype bytes,
linear-attention state, GPU memory, utilisation, weights, overhead). We plan that same shape with
``gateway.plan`` and check (1) the KV capacity in tokens, and (2) by running the pure engine with N
identical requests admitted together, that the largest N that runs without a single preemption is the
plan's max sequences at that context, within the engine's rounding: the pool is whole 16-token blocks,
and a hybrid model's per-sequence state takes whole blocks too (the plan counts it in bytes).
"""

from __future__ import annotations

import math

import pytest

from gateway.plan import CapacityPlan, ModelShape, plan_capacity
from gateway.sim.engine import Engine
from gateway.sim.profiles import PROFILES, Profile

GIB = 2**30
KV_DTYPE_BY_BYTES = {1: "fp8", 2: "fp16", 4: "fp32"}
PROMPT = 16  # small, so every request is admitted in the first step (N x 16 < max_num_batched_tokens)


def _plan(profile: Profile) -> CapacityPlan:
    shape = ModelShape(
        name=profile.name,
        layers=profile.kv_layers + profile.linear_layers,
        kv_layers=profile.kv_layers,
        kv_heads=profile.kv_heads,
        head_dim=profile.head_dim,
        kv_dtype=KV_DTYPE_BY_BYTES[profile.kv_dtype_bytes],
        seq_state_bytes=profile.linear_layers * profile.linear_state_bytes_per_layer,
        weight_bytes=round(profile.weights_gib * GIB),
    )
    return plan_capacity(shape, profile.gpu_memory_gib, profile.gpu_memory_utilization, profile.overhead_gib)


def _preempts(profile: Profile, sequences: int, total_tokens: int) -> bool:
    """Run ``sequences`` requests of ``total_tokens`` (prompt + output) to completion on virtual time."""
    engine = Engine(profile, seed=0)
    for _ in range(sequences):
        engine.submit(PROMPT, total_tokens - PROMPT, 0.0, ignore_eos=True)
    now = 0.0
    while engine.has_work:
        result = engine.step(now)
        assert result is not None, "engine stalled with work queued"
        if result.preempted:
            return True
        now = result.end
    return False


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_kv_capacity_matches_profile(profile: Profile) -> None:
    plan = _plan(profile)
    assert plan.fits
    assert plan.kv_bytes_per_token == profile.kv_bytes_per_token
    assert plan.seq_state_bytes == profile.state_bytes_per_seq
    # the profile keeps whole blocks of the same pool: at most one block's worth fewer tokens
    assert 0 <= plan.kv_capacity_tokens - profile.kv_capacity_tokens < profile.block_size


def _cases() -> list[tuple[Profile, int]]:
    cases = []
    for profile in PROFILES.values():
        for total in sorted({profile.max_model_len // 2, profile.max_model_len}):
            cases.append((profile, total))
    return cases


@pytest.mark.parametrize(("profile", "total_tokens"), _cases(), ids=lambda v: getattr(v, "name", str(v)))
def test_preemption_begins_where_the_plan_says(profile: Profile, total_tokens: int) -> None:
    plan = _plan(profile)
    # A request of P prompt and M output tokens caches P + M - 1 tokens at its end (the last sampled
    # token is never fed back), so that is the context the plan is asked about.
    cached = total_tokens - 1
    planned = plan.max_sequences(cached, block_tokens=profile.block_size)
    assert planned > 0
    # every request must be admitted in the first step, so all of them grow together
    assert (planned + 1) * PROMPT <= profile.max_num_batched_tokens and planned + 1 <= profile.max_num_seqs

    # One more sequence than the plan allows must preempt: the plan never understates what fits...
    assert _preempts(profile, planned + 1, total_tokens), f"{planned + 1} sequences ran without preemption"
    # ...and the engine's own limit sits at most its rounding below the plan.
    running = planned
    while running > 0 and _preempts(profile, running, total_tokens):
        running -= 1
    per_sequence = plan.sequence_bytes(cached, profile.block_size)
    wasted_blocks = (planned if profile.state_bytes_per_seq else 0) + 1  # < 1 block per state, < 1 in the pool
    tolerance = math.ceil(wasted_blocks * profile.block_bytes / per_sequence)
    assert planned - tolerance <= running <= planned, (planned, running, tolerance)
    # and where the engine's own capacity formula applies, it is exactly what the engine does
    assert running == profile.max_concurrency_at(cached)
