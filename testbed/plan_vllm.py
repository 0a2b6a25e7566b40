"""The planner against vLLM itself: tiny models of each architecture, the figures vLLM logs for a fixed KV
budget, and the same figures from ``sweetspot plan``.

vLLM logs, once it has sized its KV cache and before it compiles or serves anything::

    CPU KV cache size: 24,903 tokens, Maximum concurrency for 4,096 tokens per request: 6.08x

With an explicit budget (``--kv-cache-memory-bytes``) those figures depend on nothing but the model's layers,
the budget, ``--max-model-len``, ``--block-size`` and ``--max-num-batched-tokens``, so the test stops vLLM
as soon as the line appears. ``VLLM_CPU_CI_ENV=1`` skips the CPU worker's warm-up (a torch.compile of the
model, about a minute here), which only serves the automatic budget (``cpu_worker.determine_available_memory``
measures the process after it); it also runs the model eagerly, which the test never does.

``python -m testbed.plan_vllm`` starts every case and rewrites :data:`FIXTURE`, the recorded figures
with vLLM's version and each model's config.json, which ``tests/unit/test_plan_vllm_recorded.py`` checks the
planner against without vLLM.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.common.processes import ProcessError, process_factory, sweetspot
from testbed.vllm import SMALL, VLLM_CPU_VERSION, HFModelSpec, Start, ensure_model, error_lines, vllm_config

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "plan_vllm" / f"v{VLLM_CPU_VERSION}-cpu.json"
KV_LINE = (
    r"(?P<device>\w+) KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<conc>[\d.]+)x"
)
BLOCK_LINE = r"Setting attention block size to (\d+) tokens"
GIB = 2**30

#: Every case shares these, chosen so each figure is checked off a round number: a budget that is no whole
#: number of pages, a context twice the model's windows and chunks and 8x the batch, so the sliding layers'
#: reservations (window - 1 + batched tokens) differ from both the window and the context.
KV_BUDGET_BYTES = 10_000_000
MAX_MODEL_LEN = 4096
BATCHED_TOKENS = 512
BLOCK_SIZE = 32  # the CPU attention kernels want a multiple of 32 (docs/vllm.md)
WINDOW = 256
PARALLEL_STARTS = 3  # most of a start is imports and waiting; the machine has 2 cores


@dataclass(frozen=True)
class PlanCase:
    """One architecture: the tiny model, what it exercises, and any vLLM flag it needs."""

    name: str
    spec: HFModelSpec
    what: str
    vllm_args: tuple[str, ...] = ()
    block_size: int = BLOCK_SIZE  # --block-size, given to vLLM and the planner alike


def _spec(model_type: str, layers: int = 4, **config: object) -> HFModelSpec:
    return HFModelSpec(model_type=model_type, layers=layers, config=tuple(sorted(config.items())))


CASES = (
    PlanCase("llama-gqa", SMALL, "dense, GQA 4/2 heads, one group of full layers"),
    PlanCase(
        "mistral-sliding", _spec("mistral", sliding_window=WINDOW), "a model-wide sliding window: every layer slides"
    ),
    PlanCase(
        "gemma3-mixed",
        _spec("gemma3_text", layers=6, head_dim=64, sliding_window=WINDOW),
        "5 sliding + 1 full layers (Gemma-3's 5:1 pattern): 6 groups of 1",
    ),
    PlanCase(
        "gpt-oss-alternating",
        _spec("gpt_oss", head_dim=64, sliding_window=WINDOW // 2, num_local_experts=4, num_experts_per_tok=2),
        "sliding and full layers alternating (2 groups of 2), MoE",
    ),
    PlanCase(
        "llama4-chunked",
        _spec(
            "llama4_text",
            head_dim=64,
            attention_chunk_size=WINDOW,
            num_local_experts=2,
            num_experts_per_tok=1,
            intermediate_size_mlp=512,
            interleave_moe_layer_step=1,
        ),
        "3 chunked + 1 global layers, MoE",
    ),
    PlanCase(
        "deepseek-v2-mla",
        _spec(
            "deepseek_v2",
            kv_lora_rank=64,
            q_lora_rank=None,
            qk_rope_head_dim=32,
            qk_nope_head_dim=32,
            v_head_dim=64,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            first_k_dense_replace=1,
        ),
        "MLA: one latent of 64 + 32 values per token per layer; shared experts, a dense first layer",
        # vLLM picks its MLA backend by CPU: AMX_MLA (blocks a multiple of 32) where the CPU has AMX, else the
        # reference CPU_MLA, which forces 16-token blocks (vllm/platforms/cpu.py). Asking for CPU_MLA and 16
        # makes the case the same on every CPU: 10,000,000 bytes hold 813 blocks of 16, not 406 of 32.
        ("--attention-backend", "CPU_MLA"),
        block_size=16,
    ),
    # The CPU build keeps the SSM state in float32 on CPUs with AVX512-BF16 whatever the config says
    # (vllm/platforms/cpu.py); saying float32 on both sides makes the case the same on every CPU.
    PlanCase(
        "qwen3-next-hybrid",
        _spec(
            "qwen3_next",
            head_dim=64,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            linear_conv_kernel_dim=4,
            full_attention_interval=4,
            mamba_ssm_dtype="float32",
        ),
        "Gated DeltaNet + attention (3 + 1): block raised to hold a state, two state pages per request",
        ("--mamba-ssm-cache-dtype", "float32"),
    ),
)


@dataclass(frozen=True)
class Logged:
    """What vLLM printed: the KV line's figures and the attention block size it settled on."""

    line: str
    kv_cache_tokens: int
    max_concurrency: str  # as printed, 2 decimals
    block_size: int
    output: str


def start_for_figures(start: Start, case: PlanCase, timeout: float = 400.0) -> Logged:
    """Start ``vllm serve`` on the case's model with the fixed budget, read the KV line, stop it."""
    config = vllm_config(
        case.spec,
        max_model_len=MAX_MODEL_LEN,
        block_size=case.block_size,
        kv_cache_bytes=KV_BUDGET_BYTES,
        extra_env={"VLLM_CPU_CI_ENV": "1"},
        extra=("--max-num-batched-tokens", str(BATCHED_TOKENS), *case.vllm_args),
    )
    proc = start(config.command(), env=config.env(), timeout=timeout, ready_pattern=KV_LINE)
    try:
        match = proc.match
        assert match is not None
        output = proc.output()
    finally:
        proc.stop()
    blocks = re.findall(BLOCK_LINE, output)
    return Logged(
        line=match.group(0),
        kv_cache_tokens=int(match.group("tokens").replace(",", "")),
        max_concurrency=match.group("conc"),
        block_size=int(blocks[-1]) if blocks else case.block_size,
        output=output,
    )


def start_all(start: Start, parallel: int = PARALLEL_STARTS) -> dict[str, Logged | str]:
    """Every case's logged figures, or why vLLM did not log them (its output and its error lines).

    The models are generated first, one at a time; then ``parallel`` engines start at a time (most of a
    start is Python imports, one core each).
    """
    for case in CASES:
        ensure_model(case.spec)

    def one(case: PlanCase) -> Logged | str:
        try:
            return start_for_figures(start, case)
        except ProcessError as exc:
            return f"{exc}\n--- vLLM's error lines ---\n{error_lines(str(exc))}"

    with ThreadPoolExecutor(parallel) as pool:
        return dict(zip((case.name for case in CASES), pool.map(one, CASES), strict=True))


def plan_command(config_json: Path, block_size: int) -> list[str]:
    """``sweetspot plan`` with the inputs vLLM was started with (the CPU build: one batch in flight)."""
    return sweetspot(
        "plan",
        "--hf-config",
        str(config_json),
        "--kv-cache-gb",
        repr(KV_BUDGET_BYTES / GIB),
        "--context",
        str(MAX_MODEL_LEN),
        "--vllm-block-size",
        str(block_size),
        "--max-num-batched-tokens",
        str(BATCHED_TOKENS),
        "--vllm-concurrent-batches",
        "1",
        "--json",
    )


def planned(config_json: Path, block_size: int) -> dict[str, Any]:
    """The vLLM view ``sweetspot plan --json`` gives for the case's budget, context and block size."""
    done = subprocess.run(plan_command(config_json, block_size), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"sweetspot plan failed ({done.returncode}): {done.stderr}")
    view = json.loads(done.stdout)["gpus"][0]["vllm"]
    return {"block_size": view["block_size"], **view["by_context"][str(MAX_MODEL_LEN)]}


def record() -> dict[str, Any]:
    """Start every case and return the fixture's content."""
    cases: dict[str, Any] = {}
    with process_factory() as start:
        results = start_all(start)
    for case in CASES:
        logged = results[case.name]
        if isinstance(logged, str):
            cases[case.name] = {"what": case.what, "refused": logged[-3000:]}
            print(f"{case.name}: no KV line\n{logged}", file=sys.stderr)
            continue
        cases[case.name] = {
            "what": case.what,
            "config": json.loads((ensure_model(case.spec) / "config.json").read_text()),
            "vllm_args": list(case.vllm_args),
            "vllm_block_size": case.block_size,
            "logged": logged.line,
            "kv_cache_tokens": logged.kv_cache_tokens,
            "max_concurrency": logged.max_concurrency,
            "block_size": logged.block_size,
        }
        print(f"{case.name}: {logged.line}", file=sys.stderr)
    return {
        "vllm": f"vllm-cpu {VLLM_CPU_VERSION}",
        "kv_cache_memory_bytes": KV_BUDGET_BYTES,
        "max_model_len": MAX_MODEL_LEN,
        "block_size": BLOCK_SIZE,
        "max_num_batched_tokens": BATCHED_TOKENS,
        "cases": cases,
    }


if __name__ == "__main__":
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {FIXTURE}")
