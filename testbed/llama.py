"""Start a real llama-server on the generated tiny model, for integration tests and benchmarks.

The binary comes from ``make llama-server`` (or ``$SWEETSPOT_LLAMA_SERVER``); when it is missing the
test fails with the command to run, it never skips. The model is generated on first use and cached.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.common.processes import LISTENING, RunningProcess
from testbed.llama_server import LlamaServerConfig, LlamaServerNotFound, find_binary
from testbed.tiny_gguf import TinyModelSpec, ensure_model

Start = Callable[..., RunningProcess]

#: The served model id tests send in their requests (llama-server's --alias).
MODEL = "tiny-llama"


def llama_binary() -> Path:
    """The llama-server binary, or a test failure that says how to build it."""
    try:
        return find_binary()
    except LlamaServerNotFound as exc:
        why = str(exc)
    pytest.fail(why, pytrace=False)  # outside the except block: the report shows the reason alone


def llama_config(port: int = 0, **overrides: Any) -> LlamaServerConfig:
    """Test defaults for one server on the default tiny model; keyword arguments override fields."""
    return LlamaServerConfig(model=ensure_model(TinyModelSpec()), port=port, alias=MODEL, **overrides)


def start_llama_server(
    start: Start, config: LlamaServerConfig | None = None, *, timeout: float = 120.0, ready: bool = True
) -> RunningProcess:
    """Start llama-server and return once it answers ``/health`` with 200 (``ready=False``: once it listens).

    With ``port=0`` llama-server picks a free port and prints it in its "listening on" line, which it
    prints only after the model is loaded; ``proc.url`` is that address.
    """
    cfg = config if config is not None else llama_config()
    cmd = cfg.command(binary=llama_binary())
    if cfg.port == 0:
        return start(cmd, ready_pattern=LISTENING, ready_url="{url}/health" if ready else None, timeout=timeout)
    return start(cmd, ready_url=f"{cfg.base_url}/health" if ready else None, timeout=timeout)
