"""At most once, and every wait bounded: the gateway as a real process in front of upstreams that misbehave on
purpose (:mod:`testbed.fault_upstream`), each counting the requests it read. The rules case by case (drops,
refusals, stale connections, timeouts) are the component tests' (``tests/component/test_upstream_failures.py``,
``test_streaming.py``); here are the cases a real process and a raw TCP peer show."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from testbed.fault_upstream import LINGER_S, MODEL, FaultUpstream, fault_upstream, wait_for
from testbed.gateway import get_json, metric_value, start_gateway

CHAT = [{"role": "user", "content": "hi"}]


def post(url: str, body: dict, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def chat(gw: str, *, stream: bool = False, **extra: object) -> tuple[int, dict[str, str], bytes]:
    return post(f"{gw}/v1/chat/completions", {"model": MODEL, "messages": CHAT, "stream": stream, **extra})


def error_of(payload: bytes) -> dict:
    body = json.loads(payload)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def inflight(gw: str) -> int:
    return sum(u["inflight"] for u in get_json(f"{gw}/state")["upstreams"])


def gateway(processes, upstreams: list[FaultUpstream], **env: str) -> str:
    settings = {f"SWEETSPOT_{key.upper()}": value for key, value in env.items()}
    return start_gateway(
        processes, [u.url for u in upstreams], "--no-control", "--initial-limit", "4", env=settings
    ).url


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_that_dies_holding_a_request_on_a_kept_connection_gets_it_once(processes, stream) -> None:
    """The crash case: the upstream reads a request on a kept connection, holds it for seconds and dies (an
    OOM kill, a rollout). It may have been generating: no resend (the resend would find nothing listening,
    which proves nothing about the first attempt), no failover, and the client gets a 502."""
    with fault_upstream("crash_kept") as dying, fault_upstream("ok") as alive:
        gw = gateway(processes, [dying, alive], routing="least_loaded")
        answers = []
        for _ in range(12):
            status, _, payload = chat(gw, stream=stream)
            answers.append(status)
            if status != 200:
                error_of(payload)
                break
        assert answers[-1] == 502, answers  # the crash happened, and was answered
        assert dying.deliveries + alive.deliveries == len(answers), "a request reached the upstreams twice"
        assert inflight(gw) == 0


def test_a_proxys_503_page_is_not_taken_for_the_engines_refusal(processes) -> None:
    """A 503 with an HTML page comes from a proxy in front of the engine, which may have passed the request on:
    not proof that it never ran, so no failover; the client gets the 503 (and a Retry-After) once."""
    with fault_upstream("proxy_status:503") as proxied, fault_upstream("ok") as alive:
        gw = gateway(processes, [proxied, alive], routing="least_loaded")
        for _ in range(6):
            status, _, _ = chat(gw)
            assert status in (200, 502, 503)
        assert proxied.deliveries + alive.deliveries == 6


def test_a_client_that_closes_at_done_had_the_whole_answer_and_is_counted_ok(processes) -> None:
    """Clients (the OpenAI SDK among them) may close as soon as ``[DONE]`` arrives, before the upstream ends
    its body: that is a whole answer, counted ``ok``, not ``client_cancelled``, and the permit comes back at
    the hang-up, not when the upstream ends."""
    with fault_upstream("linger") as upstream:
        gw = gateway(processes, [upstream])
        address = urllib.parse.urlsplit(gw)
        conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": MODEL, "messages": CHAT, "stream": True}),
            {"content-type": "application/json"},
        )
        reply = conn.getresponse()
        assert reply.status == 200
        while (line := reply.readline()) and line.strip() != b"data: [DONE]":
            pass
        assert line.strip() == b"data: [DONE]"
        closed_at = time.monotonic()
        conn.close()
        assert wait_for(lambda: inflight(gw) == 0, timeout=LINGER_S / 2)
        assert time.monotonic() - closed_at < LINGER_S / 2
        outcomes = {
            outcome: metric_value(
                f"{gw}/metrics", "sweetspot_upstream_requests_total", {"upstream": upstream.url, "outcome": outcome}
            )
            for outcome in ("ok", "client_cancelled")
        }
        assert outcomes == {"ok": 1.0, "client_cancelled": None}, outcomes


def test_model_names_a_client_invents_do_not_become_label_values(processes) -> None:
    """The upstream's model list answers 401 (a vLLM started with --api-key), so it serves any name; 200
    requests with random model names still make one `other` label value, not 200 series."""
    with fault_upstream("ok") as upstream:
        upstream.models_status = 401
        gw = gateway(processes, [upstream])
        for index in range(200):
            status, _, _ = post(f"{gw}/v1/chat/completions", {"model": f"made-up-{index}", "messages": CHAT})
            assert status == 200
        with urllib.request.urlopen(f"{gw}/metrics", timeout=10) as resp:
            exposition = resp.read().decode()
        models = {
            line.split('model="', 1)[1].split('"', 1)[0]
            for line in exposition.splitlines()
            if line.startswith("sweetspot_") and 'model="' in line
        }
        assert models == {"other"}, sorted(models)[:10]
