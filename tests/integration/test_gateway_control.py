"""The controller inside the running gateway: it starts at a sweep's sweet spot, moves the limit under
load, and explains every decision in /state, /metrics and its log."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import openai

from gateway.common.processes import sweetspot
from testbed.gateway import get_json, metric_value, start_gateway, start_sim

CHAT = [{"role": "user", "content": "x" * 400}]
FAST = {
    "SWEETSPOT_CONTROL_INTERVAL_S": "0.5",
    "SWEETSPOT_SETTLE_S": "0.5",
    "SWEETSPOT_MEASURE_S": "1.5",
    "SWEETSPOT_WINDOW_S": "4",
    "SWEETSPOT_HEALTH_INTERVAL_S": "0.5",
}


def test_starts_at_the_sweep_result_and_controls_under_load(processes, tmp_path: Path) -> None:
    sim = start_sim(processes, time_scale=4.0).url
    sweep = subprocess.run(
        sweetspot(
            "sweep",
            "--url",
            sim,
            "--levels",
            "1,4,8",
            "--requests",
            "8",
            "--prompt-len",
            "64",
            "--output-len",
            "32",
            "--quiet",
            "--out",
            str(tmp_path / "sweep"),
        ),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    result = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    spot = result["sweet_spot"]["concurrency"]

    gw_proc = start_gateway(
        processes, [sim], "--sweep-result", str(tmp_path / "sweep" / "sweep.json"), "--log-level", "info", env=FAST
    )
    gw = gw_proc.url
    state = get_json(f"{gw}/state")["upstreams"][0]
    assert state["controller"]["start"]["limit"] == spot
    assert metric_value(f"{gw}/metrics", "sweetspot_sweep_sweet_spot", {"upstream": sim}) == spot
    assert metric_value(f"{gw}/metrics", "sweetspot_sweep_peak_tokens_per_second", {"upstream": sim}) > 0

    model = openai.OpenAI(base_url=f"{sim}/v1", api_key="x").models.list().data[0].id
    stop = time.monotonic() + 15
    errors: list[Exception] = []

    def client_loop() -> None:
        client = openai.OpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=0)
        while time.monotonic() < stop:
            try:
                for _ in client.chat.completions.create(
                    model=model, messages=CHAT, max_tokens=64, stream=True, extra_body={"ignore_eos": True}
                ):
                    pass
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=client_loop) for _ in range(48)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[:3]

    state = get_json(f"{gw}/state")["upstreams"][0]
    controller = state["controller"]
    assert controller["ticks"] >= 10
    assert controller["decisions"], "the decision log is empty"
    for entry in controller["decisions"]:
        assert entry["action"] in {"increase", "decrease", "hold"} and entry["reason"] and entry["inputs"]
    # It was driven with more clients than the sweet spot: the limit was the bottleneck and it moved.
    moved = {entry["limit"] for entry in controller["decisions"]}
    assert len(moved) > 1, controller["decisions"]
    assert 1 <= state["limit"] <= 256
    decisions = metric_value(f"{gw}/metrics", "sweetspot_controller_decisions_total", {"upstream": sim})
    assert decisions is not None and decisions >= 1
    assert metric_value(f"{gw}/metrics", "sweetspot_window_output_tokens_per_second", {"upstream": sim}) > 0
    # vLLM-format backend metrics were scraped (the simulator speaks them) and are fresh.
    assert state["backend"]["kind"] == "vllm" and state["backend"]["age_s"] < 5
    assert metric_value(f"{gw}/metrics", "sweetspot_backend_kv_cache_usage_ratio", {"upstream": sim}) is not None
    # Every limit change left one structured log line.
    gw_proc.stop()
    records = [json.loads(line) for line in gw_proc.output().splitlines() if line.startswith("{")]
    changes = [r for r in records if r.get("event") == "limit_change"]
    assert changes and all(c["logger"] == "sweetspot.controller" for c in changes)
    assert all(c["upstream"] == sim and c["limit"] != c["previous"] for c in changes)


def test_no_control_keeps_the_static_limit(processes) -> None:
    sim = start_sim(processes, time_scale=10.0).url
    gw = start_gateway(processes, [sim], "--no-control", "--initial-limit", "5", env=FAST).url
    time.sleep(1.5)
    state = get_json(f"{gw}/state")["upstreams"][0]
    assert state["limit"] == 5 and "controller" not in state
