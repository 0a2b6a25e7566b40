"""``sweetspot serve --algorithm module:factory`` or a built-in name (``SWEETSPOT_ALGORITHM``) as a user runs it: a
bad path or name ends the command with exit 2 and one line before anything listens; a good one runs in the
controller's place in front of the real simulator, hears of every request as it ends, the threshold gate opens and
holds as GIE's does, and ``--algorithm static`` holds the limit the gateway starts at.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import openai
import pytest

from gateway.common.processes import sweetspot
from testbed.gateway import get_json, metric_value, start_gateway, start_sim

GATE = {"SWEETSPOT_CONTROL_INTERVAL_S": "0.05", "SWEETSPOT_METRICS_INTERVAL_S": "0.05"}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("nomodule", "nor of the form 'module:factory'"),
        ("vegas", "neither a built-in algorithm (static, gie-threshold, envoy-gradient"),
        ("testbed.nothing_here:Gate", "cannot import 'testbed.nothing_here'"),
        ("gateway.control.baselines.threshold:NoGate", "has no attribute 'NoGate'"),
        ("gateway.control.baselines.static:StaticLimit", "calling it with no arguments failed"),
    ],
)
def test_a_bad_algorithm_exits_2_with_one_line(value: str, why: str) -> None:
    done = subprocess.run(
        sweetspot("serve", "--upstream", "http://127.0.0.1:9", "--port", "0", "--algorithm", value),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and "Traceback" not in done.stderr, done.stderr


def load(gateway: str, model: str, clients: int, seconds: float, max_tokens: int = 32) -> list[int]:
    """``clients`` closed-loop streaming clients for ``seconds``; every completed request's token count."""
    stop = time.monotonic() + seconds
    done: list[int] = []
    errors: list[Exception] = []

    def client_loop() -> None:
        client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="x", max_retries=0)
        while time.monotonic() < stop:
            try:
                chunks = sum(
                    1
                    for chunk in client.completions.create(
                        model=model,
                        prompt="x" * 64,
                        max_tokens=max_tokens,
                        stream=True,
                        extra_body={"ignore_eos": True},
                    )
                    if chunk.choices and chunk.choices[0].text
                )
                done.append(chunks)
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors[:3]
    return done


def test_every_request_end_reaches_the_algorithm_and_its_limit_holds(processes) -> None:
    sim = start_sim(processes, time_scale=8.0).url
    gw = start_gateway(
        processes,
        [sim],
        env={"SWEETSPOT_ALGORITHM": "testbed.algorithms:Counting", "SWEETSPOT_CONTROL_INTERVAL_S": "0.2"},
    ).url
    model = openai.OpenAI(base_url=f"{sim}/v1", api_key="x").models.list().data[0].id
    done = load(gw, model, clients=8, seconds=4)
    state = get_json(f"{gw}/state")["upstreams"][0]
    seen = state["controller"]["algorithm"]
    assert seen["algorithm"] == "counting" and seen["ticks"] >= 5
    assert seen["ended"] == len(done) > 0, (len(done), json.dumps(seen))  # each request, once
    # Clients that close as soon as they read [DONE], before the gateway saw the upstream's end, had their
    # whole answer: ok, every one.
    assert seen["ok"] == seen["ended"], json.dumps(seen)
    assert seen["tokens"] == sum(done)
    # 8 clients against a limit of 3: never more than 3 in flight, and the end listener sees the count after.
    assert seen["max_inflight_at_start"] == 3 and seen["max_inflight_after"] == 2
    assert state["limit"] == 3


def test_a_built_in_name_runs_in_the_controllers_place(processes) -> None:
    """``--algorithm static`` (a flag, as a user types it): the limit the gateway starts at, held under demand,
    with the control loop's state view and decision counts."""
    sim = start_sim(processes, time_scale=8.0).url
    gw = start_gateway(
        processes, [sim], "--algorithm", "static", "--initial-limit", "5", env={"SWEETSPOT_CONTROL_INTERVAL_S": "0.2"}
    ).url
    model = openai.OpenAI(base_url=f"{sim}/v1", api_key="x").models.list().data[0].id
    assert load(gw, model, clients=8, seconds=2)
    state = get_json(f"{gw}/state")["upstreams"][0]
    assert state["limit"] == 5 and state["controller"]["algorithm"] == {"algorithm": "static", "limit": 5}
    assert state["controller"]["ticks"] >= 3
    held = metric_value(f"{gw}/metrics", "sweetspot_controller_decisions_total", {"upstream": sim, "action": "hold"})
    assert held is not None and held >= 3


def test_the_threshold_gate_opens_for_demand_and_shuts_on_the_backends_queue(processes) -> None:
    """The simulator runs at most 4 requests at once: with 24 clients the open gate lets everyone in, the
    backend queues 20 of them itself, and the gate (waiting >= 5) shuts until enough have ended."""
    sim = start_sim(processes, "--max-num-seqs", "4", time_scale=4.0).url
    proc = start_gateway(
        processes, [sim], env={**GATE, "SWEETSPOT_ALGORITHM": "gateway.control.baselines.threshold:ThresholdGate"}
    )
    gw = proc.url
    model = openai.OpenAI(base_url=f"{sim}/v1", api_key="x").models.list().data[0].id
    limits: list[int] = []
    gates: list[bool] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            algorithm = get_json(f"{gw}/state")["upstreams"][0]["controller"]["algorithm"]
            limits.append(algorithm["limit"])
            gates.append(algorithm["open"])
            time.sleep(0.1)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        done = load(gw, model, clients=24, seconds=6, max_tokens=32)
    finally:
        sampling.set()
        watcher.join()
    assert done
    assert True in gates and False in gates, gates  # it opened, and it shut
    assert max(limits) > 8, limits  # open: everyone waiting went through, far past the default initial limit
    waiting = metric_value(f"{gw}/metrics", "sweetspot_backend_requests_waiting", {"upstream": sim})
    assert waiting is not None
