"""`sweetspot serve` refuses bad configuration at start-up with one clear line, not a traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gateway.common.processes import sweetspot


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWEETSPOT_")}
    return subprocess.run(
        sweetspot("serve", *args), capture_output=True, text=True, timeout=60, env={**clean, **(env or {})}
    )


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), None, "no upstream configured"),
        (("-u", "http://127.0.0.1:9", "--config", "/nonexistent.toml"), None, "config file not found"),
        (("-u", "http://127.0.0.1:9"), {"SWEETSPOT_PORT": "eighty"}, "invalid settings: port"),
        (("-u", "http://127.0.0.1:9"), {"SWEETSPOT_LIMIT_MIN": "9", "SWEETSPOT_LIMIT_MAX": "3"}, "limit_min"),
    ],
)
def test_bad_settings_exit_2_with_the_reason(args, env, expected) -> None:
    result = run_serve(*args, env=env)
    assert result.returncode == 2
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_a_file_that_is_no_sweep_result(tmp_path: Path) -> None:
    bogus = tmp_path / "sweep.json"
    bogus.write_text("{}")
    result = run_serve("-u", "http://127.0.0.1:9", "--sweep-result", str(bogus))
    assert result.returncode == 2 and "not a sweetspot sweep result" in result.stderr
