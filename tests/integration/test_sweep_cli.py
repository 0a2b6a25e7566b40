"""``sweetspot sweep`` as a user runs it: a subprocess against a ``sweetspot sim`` subprocess.

Checks the files it writes (JSON loadable by ``load_sweep_result``, markdown, PNG), its plain
line-by-line output when stdout is not a terminal, the chunk-count fallback when the server sends
no usage, the open-loop mode, and its exit codes for bad input and an unreachable server.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.common.processes import LISTENING, RunningProcess, start_process, sweetspot
from gateway.sweep.result import load_sweep_result


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningProcess]:
    with start_process(
        sweetspot("sim", "--port", "0", "--time-scale", "4"), ready_pattern=LISTENING, timeout=60
    ) as proc:
        yield proc


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sweetspot("sweep", *args), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


@pytest.mark.timeout(180)
def test_closed_loop_run_writes_its_files(sim: RunningProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_cli(
        "--url",
        sim.url + "/v1",
        "--levels",
        "1,4",
        "--duration",
        "1.5",
        "--warmup-s",
        "0.5",
        "--prompt-len",
        "32..64",
        "--output-len",
        "normal:24,4",
        "--extra-body",
        json.dumps({"stream_options": {"include_usage": False}}),
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("[1/2] concurrency 1: ") and "tok/s" in line for line in lines), done.stdout
    assert any(line.startswith("[2/2] concurrency 4: ") and "tok/s" in line for line in lines), done.stdout
    assert "\r" not in done.stdout and "\x1b[" not in done.stdout  # no progress-bar redraws in a log
    assert any(line.startswith("sweet spot: ") for line in lines)

    result = load_sweep_result(out / "sweep.json")
    assert [lv.concurrency for lv in result.levels] == [1, 4]
    assert result.settings.duration_s == 1.5 and result.settings.workload["output_len"] == "normal:24,4"
    assert result.token_counting == "chunks" and any("did not report usage" in n for n in result.notes)
    assert all(lv.completed > 0 and lv.output_tokens_per_s > 0 for lv in result.levels)
    assert result.peak_tokens_per_s == max(lv.output_tokens_per_s for lv in result.levels)
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 4 |" in (out / "sweep.md").read_text()


@pytest.mark.timeout(180)
def test_open_loop_run_with_slos_disabled(sim: RunningProcess, tmp_path: Path) -> None:
    done = run_cli(
        "--url",
        sim.url,
        "--api",
        "completions",
        "--levels",
        "4",
        "--rate",
        "40",
        "--requests",
        "12",
        "--warmup",
        "2",
        "--output-len",
        "16",
        "--slo-ttft-ms",
        "0",
        "--slo-tpot-ms",
        "0",
        "--quiet",
        "--out",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = load_sweep_result(tmp_path / "sweep.json")
    assert result.settings.mode == "poisson" and result.settings.rate == 40
    assert result.settings.slo.ttft_ms is None and result.levels[0].goodput_requests_per_s is None
    assert result.levels[0].requests >= 12 and result.token_counting == "usage"
    assert result.sweet_spot is not None and result.sweet_spot.concurrency == 4


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    done = run_cli("--url", "http://127.0.0.1:9", "--prompt-len", "gamma:1,2", "--out", str(tmp_path))
    assert done.returncode == 2 and "cannot read length" in done.stderr


def test_unreachable_server_fails_fast_and_clearly(tmp_path: Path) -> None:
    done = run_cli("--url", "http://127.0.0.1:9", "--out", str(tmp_path / "x"), timeout=60)
    assert done.returncode == 1 and "cannot list models" in done.stderr
    assert not (tmp_path / "x").exists()
