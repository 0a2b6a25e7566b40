"""`sweetspot plan` through typer's CliRunner: the rich table and the --json output."""

from __future__ import annotations

import json

import pytest
from click.testing import Result
from typer.testing import CliRunner

from gateway.cli import _register, app

QWEN36 = [
    "--name",
    "qwen3.6-35b-a3b",
    "--params",
    "35B",
    "--active-params",
    "3B",
    "--experts",
    "256",
    "--experts-used",
    "8",
    "--layers",
    "40",
    "--kv-layers",
    "10",
    "--kv-heads",
    "2",
    "--head-dim",
    "256",
    "--weights-gb",
    "22",
    "--seq-state",
    "62.8125MiB",
    "--overhead-gb",
    "1.5",
]


def _invoke(args: list[str]) -> Result:
    _register()  # what `sweetspot` does at start-up: import every sub-command module
    return CliRunner().invoke(app, ["plan", *args], prog_name="sweetspot")


def test_table_shows_capacity_and_does_not_fit() -> None:
    result = _invoke([*QWEN36, "--gpu-gb", "24,32", "--gpu-memory-utilization", "0.9", "--context", "4K,32K"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "20,480 B" in out  # KV bytes per token
    assert "62.81 MiB" in out  # per-sequence state
    assert "does not fit" in out  # 24 GB at 0.9: 21.6 GiB budget < 23.5 GiB
    # 32 GB at 0.9: 28.8 - 22 - 1.5 = 5.3 GiB = 5,690,831,667 B
    #   4K: / 149,749,760 = 38.0 -> 38;  32K: / 736,952,320 = 7.72 -> 7
    row = next(line for line in out.splitlines() if line.strip().startswith("32 GB") and "38" in line)
    assert row.split()[-2:] == ["38", "7"]


def test_json_output() -> None:
    result = _invoke(
        [
            *QWEN36,
            "--gpu-gb",
            "24",
            "--gpu-gb",
            "32",
            "--gpu-memory-utilization",
            "1.0",
            "--context",
            "4096,8K",
            "--bandwidth-gbs",
            "1792",
            "--json",
        ]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["kv_bytes_per_token"] == 20_480
    assert report["seq_state_bytes"] == 65_863_680
    by_gpu = {g["gpu_gb"]: g for g in report["gpus"]}
    # 24 GB at 1.0: 0.5 GiB left -> 4K: 3, 8K: floor(536,870,912 / 233,635,840) = 2
    assert by_gpu[24.0]["max_sequences"] == {"4096": 3, "8192": 2}
    # 32 GB at 1.0: 8.5 GiB -> 60 and 39 (hand-checked in test_plan_arith)
    assert by_gpu[32.0]["max_sequences"] == {"4096": 60, "8192": 39}
    assert by_gpu[32.0]["kv_memory_bytes"] == 9_126_805_504
    # one stream at 4K: 1792e9 / (22 GiB x 3/35 + 4096 x 20,480 + 65,863,680) B/step
    per_step = int(22 * 2**30 * 3 / 35) + 83_886_080 + 65_863_680
    assert report["decode"]["single_stream_tokens_per_s"]["4096"] == pytest.approx(1792e9 / per_step)
    assert {(b["gpu_gb"], b["context"], b["batch"]) for b in report["decode"]["batch"]} == {
        (24.0, 4096, 3),
        (24.0, 8192, 2),
        (32.0, 4096, 60),
        (32.0, 8192, 39),
    }


def test_json_marks_weights_that_do_not_fit_as_null() -> None:
    result = _invoke([*QWEN36, "--gpu-gb", "16", "--json"])
    assert result.exit_code == 0, result.output
    gpu = json.loads(result.output)["gpus"][0]
    assert gpu["fits"] is False
    assert gpu["kv_capacity_tokens"] == 0
    assert set(gpu["max_sequences"].values()) == {None}
    assert gpu["verdict"].startswith("does not fit")


def test_missing_shape_is_a_clear_error() -> None:
    result = _invoke(["--params", "8B", "--weight-quant", "bf16"])
    assert result.exit_code == 2
    assert "layer" in result.output


def test_gguf_file_with_flag_overrides(tmp_path) -> None:
    from tests.unit.test_plan_sources import _write_gguf

    path = tmp_path / "llama-tiny.gguf"
    _write_gguf(
        path,
        "llama",
        {"block_count": 32, "embedding_length": 4096, "attention.head_count": 32, "attention.head_count_kv": 8},
        {"token_embd.weight": (4, 4)},
    )
    # the file gives the shape (131,072 B/token at fp16); the flags give the weights and a q8_0 cache
    result = _invoke(
        [
            "--gguf",
            str(path),
            "--weights-gb",
            "15",
            "--kv-dtype",
            "q8_0",
            "--gpu-gb",
            "24",
            "--gpu-memory-utilization",
            "1.0",
            "--overhead-gb",
            "1",
            "--context",
            "8K",
            "--json",
        ]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    # q8_0: 2 rows x 32 blocks x 34 B x 32 layers = 69,632 B/token
    assert report["kv_bytes_per_token"] == 69_632
    assert report["model"]["sources"]["kv_heads"] == "gguf:llama.attention.head_count_kv"
    assert report["model"]["sources"]["weight_bytes"] == "flag"
    # (24 - 15 - 1) GiB = 8,589,934,592 B / (8192 x 69,632 = 570,425,344) = 15.06 -> 15
    assert report["gpus"][0]["max_sequences"] == {"8192": 15}
