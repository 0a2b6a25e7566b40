"""Rollouts cut nothing: SIGTERM to a real gateway process in front of the simulator, with streams running and
a full queue."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request

import httpx

from testbed.fault_upstream import wait_for
from testbed.gateway import get_json, start_gateway, start_sim

CHAT = [{"role": "user", "content": "tell me a long story"}]


def model_of(base: str) -> str:
    return str(get_json(f"{base}/v1/models")["data"][0]["id"])


def stream_events(gw: str, model: str, max_tokens: int) -> list[dict]:
    """Every SSE event of one streamed chat completion ([DONE] as {"done": True})."""
    events: list[dict] = []
    body = {"model": model, "messages": CHAT, "stream": True, "max_tokens": max_tokens, "ignore_eos": True}
    with httpx.stream("POST", f"{gw}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                events.append({"done": True} if data == "[DONE]" else json.loads(data))
    return events


def status_of(url: str, body: dict | None = None) -> tuple[int, dict[str, str], dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="GET" if body is None else "POST", headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, json.loads(err.read())


def in_background(target, count: int) -> tuple[list[threading.Thread], dict[int, object]]:  # type: ignore[no-untyped-def]
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            results[i] = target()
        except Exception as exc:  # noqa: BLE001 - kept for the assertion's message
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


def test_sigterm_lets_running_streams_finish_and_refuses_new_and_queued_work(processes) -> None:
    sim = start_sim(processes, time_scale=1.0)
    proc = start_gateway(
        processes,
        [sim.url],
        "--no-control",
        "--initial-limit",
        "16",
        "--max-queue",
        "8",
        env={"SWEETSPOT_DRAIN_TIMEOUT_S": "120"},
    )
    gw, model = proc.url, model_of(sim.url)
    streams, streamed = in_background(lambda: stream_events(gw, model, 160), 16)
    assert wait_for(lambda: get_json(f"{gw}/state")["upstreams"][0]["inflight"] == 16, 30)
    queued, refused = in_background(
        lambda: status_of(f"{gw}/v1/chat/completions", {"model": model, "messages": CHAT, "max_tokens": 4}), 8
    )
    assert wait_for(lambda: get_json(f"{gw}/state")["queue"]["depth"] == 8, 30)

    proc.popen.send_signal(signal.SIGTERM)
    assert wait_for(lambda: status_of(f"{gw}/readyz")[0] == 503, 2)
    assert status_of(f"{gw}/readyz")[2]["draining"] is True
    status, headers, payload = status_of(f"{gw}/v1/chat/completions", {"model": model, "messages": CHAT})
    assert status == 503 and headers["retry-after"] == "1" and headers.get("connection") == "close"
    assert payload["error"]["code"] == "shutting_down"

    for thread in queued:
        thread.join(30)
    for answer in refused.values():
        assert isinstance(answer, tuple), answer
        status, headers, payload = answer
        assert status == 503 and headers["retry-after"] == "1" and payload["error"]["code"] == "shutting_down"

    assert get_json(f"{gw}/state")["upstreams"][0]["inflight"] > 0  # the streams were still running
    for thread in streams:
        thread.join(120)
    assert len(streamed) == 16
    for events in streamed.values():
        assert isinstance(events, list), events
        assert not any("error" in event for event in events)
        assert events[-1] == {"done": True}
        assert any(event.get("choices") and event["choices"][0].get("finish_reason") for event in events[:-1])
    assert proc.popen.wait(60) == 0


def test_a_stream_still_running_at_the_drain_deadline_ends_with_an_error_event(processes) -> None:
    sim = start_sim(processes, time_scale=0.2)  # five times slower than the profile: a long stream
    proc = start_gateway(processes, [sim.url], "--no-control", env={"SWEETSPOT_DRAIN_TIMEOUT_S": "1"})
    gw, model = proc.url, model_of(sim.url)
    streams, streamed = in_background(lambda: stream_events(gw, model, 2000), 2)
    assert wait_for(lambda: get_json(f"{gw}/state")["upstreams"][0]["inflight"] == 2, 30)
    time.sleep(0.5)
    signalled = time.monotonic()
    proc.popen.send_signal(signal.SIGTERM)
    for thread in streams:
        thread.join(30)
    for events in streamed.values():
        assert isinstance(events, list), events
        assert events[-1]["error"]["code"] == "shutting_down"
        assert any(event.get("choices") for event in events)  # it had been streaming
    assert proc.popen.wait(30) == 0
    assert time.monotonic() - signalled < 15
