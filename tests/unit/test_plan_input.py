"""`sweetspot plan` on bad input: exit 2 and one line naming the file and field (or the flag); and what
the report says beside the numbers (assumptions, warnings, vLLM's view, a fixed KV budget)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from gateway.cli import _register, app
from tests.unit.test_plan_published import GEMMA2_9B, LLAMA31_8B, MISTRAL_7B_V01


def _invoke(args: list[str]) -> Result:
    _register()
    return CliRunner().invoke(app, ["plan", *args], prog_name="sweetspot")


def _config(tmp_path: Path, body: Any) -> Path:
    path = tmp_path / "config.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


def _refused(result: Result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _without(cfg: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k != key}


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        (_without(LLAMA31_8B, "hidden_size"), "hidden_size", "missing"),
        (_without(LLAMA31_8B, "num_hidden_layers"), "num_hidden_layers", "missing"),
        (dict(LLAMA31_8B, num_hidden_layers=None), "num_hidden_layers", "null"),
        (dict(LLAMA31_8B, num_attention_heads=0), "num_attention_heads", "positive"),
        (dict(LLAMA31_8B, num_hidden_layers=-32), "num_hidden_layers", "positive"),
        (dict(LLAMA31_8B, num_key_value_heads=-8), "num_key_value_heads", "positive"),
        (dict(LLAMA31_8B, num_key_value_heads=5), "num_key_value_heads", "does not divide"),
        (dict(LLAMA31_8B, hidden_size=4100), "hidden_size", "not a multiple"),
        (dict(LLAMA31_8B, num_hidden_layers=32.5), "num_hidden_layers", "integer"),
        (dict(LLAMA31_8B, num_hidden_layers="32"), "num_hidden_layers", "integer"),
        (dict(LLAMA31_8B, num_hidden_layers=True), "num_hidden_layers", "integer"),
        (dict(LLAMA31_8B, max_position_embeddings=0), "max_position_embeddings", "positive"),
        (dict(LLAMA31_8B, num_hidden_layers=10**9), "num_hidden_layers", "at most"),
        (dict(MISTRAL_7B_V01, sliding_window=-4096), "sliding_window", "positive"),
        (dict(LLAMA31_8B, layer_types=["full_attention"] * 31), "layer_types", "fewer"),
        (dict(LLAMA31_8B, layer_types=["weird"] * 32), "layer_types", "weird"),
        (dict(LLAMA31_8B, torch_dtype="float7"), "torch_dtype", "float7"),
        (dict(LLAMA31_8B, quantization_config={"quant_method": "mystery"}), "quantization_config", "mystery"),
        (dict(LLAMA31_8B, quantization_config={"quant_method": "awq", "bits": 0}), "quantization_config", "bits"),
        ({"text_config": dict(LLAMA31_8B, num_attention_heads=0)}, "text_config.num_attention_heads", "positive"),
    ],
)
def test_malformed_config_is_one_line_naming_file_and_field(
    tmp_path: Path, body: Any, field: str, problem: str
) -> None:
    path = _config(tmp_path, body)
    _refused(_invoke(["--hf-config", str(path)]), str(path), field, problem)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("[1, 2, 3]", "expected a JSON object, got a list"),
        ("null", "got a null"),
        ("{not json", "not valid JSON"),
        # Python's json reads Infinity; a non-finite size is still refused, by name
        (json.dumps(LLAMA31_8B)[:-1] + ', "hidden_size": Infinity}', "hidden_size must be an integer, got inf"),
    ],
)
def test_config_that_is_not_an_object(tmp_path: Path, body: str, problem: str) -> None:
    path = _config(tmp_path, body)
    _refused(_invoke(["--hf-config", str(path)]), str(path), problem)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--gpu-gb", "inf"], "--gpu-gb"),
        (["--gpu-gb", "nan"], "--gpu-gb"),
        (["--gpu-gb", "-24"], "--gpu-gb"),
        (["--gpu-gb", "0"], "--gpu-gb"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--gpu-memory-utilization", "inf"], "--gpu-memory-utilization"),
        (["--overhead-gb", "-1"], "--overhead-gb"),
        (["--kv-cache-gb", "inf"], "--kv-cache-gb"),
        (["--bandwidth-gbs", "0"], "--bandwidth-gbs"),
        (["--block-tokens", "0"], "--block-tokens"),
        (["--max-num-batched-tokens", "-1"], "--max-num-batched-tokens"),
        (["--context", "999999999"], "beyond any model"),
        (["--context", "0"], "positive"),
        (["--context", "abc"], "token count"),
        (["--kv-cache-gb", "8", "--gpu-gb", "24"], "not both"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(tmp_path: Path, flags: list[str], needle: str) -> None:
    path = _config(tmp_path, LLAMA31_8B)
    _refused(_invoke(["--hf-config", str(path), *flags]), needle)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--layers", "-32"], "--layers"),
        (["--kv-heads", "-8"], "--kv-heads"),
        (["--kv-heads", "0"], "--kv-heads"),
        (["--head-dim", "x"], "--head-dim"),
        (["--weights-gb", "-16"], "--weights-gb"),
        (["--weights-gb", "inf"], "--weights-gb"),
        (["--params", "-8B"], "parameter count"),
        (["--experts", "8", "--experts-used", "9"], "--experts-used"),
        (["--kv-layers", "40"], "--kv-layers"),
        (["--layers", "1000000000"], "--layers"),
    ],
)
def test_bad_shape_flags_never_read_as_capacity(flags: list[str], needle: str) -> None:
    base = ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--params", "8B", "--weight-quant", "bf16"]
    _refused(_invoke([*base, *flags]), needle)


def test_missing_file_is_one_line() -> None:
    _refused(_invoke(["--hf-config", "/nonexistent/config.json"]), "--hf-config", "no such file")


def test_context_past_native_length_is_a_warning(tmp_path: Path) -> None:
    path = _config(tmp_path, GEMMA2_9B)
    result = _invoke(["--hf-config", str(path), "--gpu-gb", "80", "--context", "4K,16K", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    # native 8192: 16K is past it, 4K is not
    assert len(report["warnings"]) == 1
    assert "16,384" in report["warnings"][0] and "8,192" in report["warnings"][0]
    table = _invoke(["--hf-config", str(path), "--gpu-gb", "80", "--context", "16K"])
    assert table.exit_code == 0
    assert "warning: context 16,384 is past the model's native length" in " ".join(table.output.split())


def test_assumptions_are_in_json_and_table(tmp_path: Path) -> None:
    path = _config(tmp_path, GEMMA2_9B)
    result = _invoke(["--hf-config", str(path), "--gpu-gb", "24", "--context", "8K", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    joined = " | ".join(report["assumptions"])
    assert "float32" in joined and "bf16" in joined  # fp32 checkpoint planned at 16 bits
    assert "ties them by default" in joined  # Gemma's absent tie_word_embeddings
    assert "Gemma-2's layout" in joined  # sliding layout from the family, not from layer_types
    assert report["model"]["sliding_layers"] == 21
    table = _invoke(["--hf-config", str(path), "--gpu-gb", "24", "--context", "8K"])
    flat = " ".join(table.output.split())
    assert "Assumptions:" in flat and "ties them by default" in flat


def test_fixed_kv_budget_and_vllm_view_in_json(tmp_path: Path) -> None:
    path = _config(tmp_path, MISTRAL_7B_V01)
    result = _invoke(
        [
            "--hf-config",
            str(path),
            "--kv-cache-gb",
            "8",
            "--context",
            "32K",
            "--max-num-batched-tokens",
            "2048",
            "--json",
        ]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    (row,) = report["gpus"]
    assert row["gpu_gb"] is None and row["kv_cache_gb"] == 8
    # 8 GiB = 8,589,934,592 B; Mistral's 32 sliding layers hold 4096 tokens each at 4096 B/token/layer:
    # 32 x 4096 x 4096 = 536,870,912 per sequence -> exactly 16
    assert row["kv_memory_bytes"] == 8_589_934_592
    assert row["max_sequences"] == {"32768": 16}
    # vLLM: 8,589,934,592 // 65,536 // 32 = 4096 blocks (65,536 tokens of pool);
    # a 32K request reserves ceil(min(4095 + 2 x 2048, 32768) / 16) + 1 = 512 + 1 = 513 blocks (2 batches in
    # flight, a GPU's async scheduling) -> 4096 / 513 = 7.98x; tokens int(7.9844 x 32768) = 261,632
    vllm = row["vllm"]
    assert (vllm["max_num_batched_tokens"], vllm["concurrent_batches"], vllm["prefix_caching"]) == (2048, 2, True)
    cell = vllm["by_context"]["32768"]
    assert (cell["kv_cache_tokens"], cell["blocks_per_request"], cell["max_concurrency"]) == (261_632, 513, 7.98)
    assert any("sliding" in note for note in report["vllm_differs"])
    # one batch in flight (the CPU build): ceil((4095 + 2048) / 16) + 1 = 385 -> 10.64x; int(10.6390 x 32768) = 348,617
    single = _invoke(
        [
            "--hf-config",
            str(path),
            "--kv-cache-gb",
            "8",
            "--context",
            "32K",
            "--max-num-batched-tokens",
            "2048",
            "--vllm-concurrent-batches",
            "1",
            "--json",
        ]
    )
    cell = json.loads(single.output)["gpus"][0]["vllm"]["by_context"]["32768"]
    assert (cell["kv_cache_tokens"], cell["blocks_per_request"], cell["max_concurrency"]) == (348_617, 385, 10.64)
    table = _invoke(["--hf-config", str(path), "--kv-cache-gb", "8", "--context", "32K"])
    assert table.exit_code == 0, table.output
    flat = " ".join(table.output.split())
    assert "What vLLM will log" in flat and "261,632, 7.98x" in flat and "KV 8 GiB" in flat


def test_vllm_refuses_when_one_request_does_not_fit(tmp_path: Path) -> None:
    path = _config(tmp_path, LLAMA31_8B)
    # 0.5 GiB of KV: 536,870,912 // 65,536 // 32 = 256 blocks; a 128K request needs 8192 blocks: vLLM will not
    # start; it would log int(256 / 8192 x 131,072) = 4096 tokens
    result = _invoke(["--hf-config", str(path), "--kv-cache-gb", "0.5", "--context", "128K", "--json"])
    assert result.exit_code == 0, result.output
    cell = json.loads(result.output)["gpus"][0]["vllm"]["by_context"]["131072"]
    assert cell["kv_cache_tokens"] == 4096
    assert cell["starts"] is False
