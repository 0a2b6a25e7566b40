"""The controller in the running gateway against real preemption (#16): a real vLLM (the CPU build, the
generated ``KNEE`` model) whose KV budget holds C = 11 requests of the workload, 3C closed-loop streaming
clients, and static limits of C and 2C measured in the same test (``testbed/vllm_preemption.py`` says
how, and why the prompts are 512 words and the answers' lengths spread).

The controller must see static 2C preempt in the same test, settle at or below what the gateway's hard cap
lets run (``Budget.fits``: 12, the requests out of step with room for three spreads of their KV), see at most
one preemption a minute while judged, and deliver at least 0.9x each static limit's goodput (within a TTFT
objective of 4 s, ``OBJECTIVES`` says why, and the gateway's TPOT objective), the median of round-by-round ratios
over rotated rounds, unless it ran at exactly that limit through every measured run: then it was that
configuration, and its ratio is the machine's noise (as in ``test_controller_llama.py``).
``bench/controller_vllm.py`` runs the same comparison longer, for whole answers too, and writes the figures
docs/vllm.md shows.

One vLLM for the module and three gateways: 60 s to converge, then three rounds of three 25-second runs (15 s of
warm-up, 10 s measured), vLLM idle between runs, the requests in flight at the end of a run let finish (their
tokens inside the run count towards goodput).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

import pytest

from testbed.vllm import KNEE, VllmConfig, compute_dtype, start_vllm, vllm_config
from testbed.vllm_preemption import BLOCK, KV_BLOCKS, OUTPUT, PROMPT_WORDS, Budget, Pace, compare, measure_budget

PACE = Pace(converge_s=60.0, measure_s=10.0, rounds=3)  # the warm-up outlasts each run's start-up wave
# The objectives every gateway here holds and goodput is judged by. A 545-token prefill among ten decodes takes
# 1-2 s on these 2 cores, so at C the p99 TTFT sits about the default objective's 2 s, and on a busy machine a
# reading above it cut the controller to 8 (0.887 of static 11): the test would judge the machine's load, not
# the KV budget. With 4 s, what tells the limits apart is what preemption does: a preempted request stalls
# while it is recomputed and misses the 0.1-s TPOT objective.
OBJECTIVES = {"SWEETSPOT_TTFT_P99_SLO_S": "4"}

# The time scale above (answers of 96-160 tokens, 10-s runs, the 0.1-s TPOT objective) holds on CPUs that compute
# bfloat16 natively, where C streams draw about 290 tokens/s. On one without (an AVX2-only EPYC), KNEE served them
# at 71 tokens/s even in float32: every request at C missed the TPOT objective and the test ran past its timeout.
# Scaling the answers down by that factor did not rescue it: the 545-token prefills then dominate the work and the
# runs' drains (docs/vllm.md, "On a CPU without native bfloat16").
pytestmark = pytest.mark.skipif(
    compute_dtype() is not None,
    reason="no native bfloat16 on this CPU (AVX512-BF16 or AMX): KNEE is about 4x too slow here for the test's "
    "time scale and objectives (docs/vllm.md, 'On a CPU without native bfloat16')",
)


@pytest.fixture(scope="module")
def config() -> VllmConfig:
    return vllm_config(KNEE, max_num_seqs=64, num_gpu_blocks=KV_BLOCKS, max_model_len=2048, block_size=BLOCK)


@pytest.fixture(scope="module")
def budget(module_processes, config) -> Budget:
    start_vllm(module_processes, config, timeout=600)
    budget = asyncio.run(measure_budget(config.base_url, PROMPT_WORDS, OUTPUT, KV_BLOCKS))
    assert budget.c >= 8, f"{budget}: C = {budget.c}, too few for a knee below the budget to matter"
    return budget


@pytest.mark.timeout(900)
async def test_controller_holds_streams_below_preemption_at_the_best_static_limit(
    module_processes, config, budget
) -> None:
    outcome = await compare(module_processes, config.base_url, budget, streamed=True, pace=PACE, env=OBJECTIVES)
    print(f"{outcome.summary()}, limit changes {outcome.limit_changes}")
    report = f"not met: {outcome.failed()}\n{outcome.summary()}\n{json.dumps(asdict(outcome), indent=1)}"
    assert not outcome.failed(), report
