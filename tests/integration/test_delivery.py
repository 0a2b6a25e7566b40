"""At most once, and every wait bounded: the gateway as a real process in front of upstreams that misbehave on
purpose (:mod:`testbed.fault_upstream`), each counting the requests it read."""

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


def sse_events(payload: bytes) -> list[dict]:
    return [
        json.loads(line[5:])
        for line in payload.decode().split("\n")
        if line.startswith("data:") and line.strip() != "data: [DONE]"
    ]


def inflight(gw: str) -> int:
    return sum(u["inflight"] for u in get_json(f"{gw}/state")["upstreams"])


def gateway(processes, upstreams: list[FaultUpstream], **env: str) -> str:
    settings = {f"SWEETSPOT_{key.upper()}": value for key, value in env.items()}
    return start_gateway(
        processes, [u.url for u in upstreams], "--no-control", "--initial-limit", "4", env=settings
    ).url


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_an_upstream_read_and_dropped_is_never_sent_again(processes, stream: bool) -> None:
    """The upstream may have started generating: no resend, no failover, a 502, and each request read once."""
    with fault_upstream("drop") as first, fault_upstream("drop") as second:
        gw = gateway(processes, [first, second])
        for _ in range(6):
            status, _, payload = chat(gw, stream=stream)
            assert status == 502 and error_of(payload)["code"] == "upstream_unavailable"
        assert first.deliveries + second.deliveries == 6
        assert inflight(gw) == 0


def test_a_kept_connection_closed_under_the_next_request_is_resent_and_delivered_once(processes) -> None:
    """The keep-alive race, made certain: the server closes a kept connection when the next request arrives,
    without reading it. That request never reached it, so it goes again and is read exactly once."""
    with fault_upstream("close_next") as upstream:
        gw = gateway(processes, [upstream])
        for done in range(1, 7):
            status, _, payload = chat(gw)
            assert status == 200, payload
            assert upstream.deliveries == done
        resent = metric_value(
            f"{gw}/metrics",
            "sweetspot_upstream_retries_total",
            {"upstream": upstream.url, "reason": "stale_connection"},
        )
        assert resent is not None and resent >= 5


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


def test_a_refused_connection_fails_over_and_the_request_is_read_once(processes) -> None:
    with fault_upstream("ok") as doomed, fault_upstream("ok") as alive:
        gw = gateway(processes, [doomed, alive])
        doomed.close()  # nothing listens there any more
        for _ in range(6):
            status, _, _ = chat(gw)
            assert status == 200
        assert alive.deliveries == 6 and doomed.deliveries == 0


@pytest.mark.parametrize("refusal", [503, 429])
def test_a_refusal_fails_over_at_most_once(processes, refusal: int) -> None:
    """An explicit 503/429 means "not run": one other upstream is tried, never a third."""
    with (
        fault_upstream(f"status:{refusal}") as a,
        fault_upstream(f"status:{refusal}") as b,
        fault_upstream(f"status:{refusal}") as c,
    ):
        gw = gateway(processes, [a, b, c])
        for sent in range(1, 5):
            status, headers, payload = chat(gw)
            assert status == refusal and headers.get("retry-after")
            error_of(payload)
            assert a.deliveries + b.deliveries + c.deliveries == 2 * sent
    with fault_upstream("status:503") as refusing, fault_upstream("ok") as alive:
        gw = gateway(processes, [refusing, alive])
        for _ in range(6):
            assert chat(gw)[0] == 200
        assert alive.deliveries == 6


def test_a_hung_upstream_times_out_releases_its_permit_and_is_taken_out(processes) -> None:
    with fault_upstream("hang") as hung:
        gw = gateway(
            processes,
            [hung],
            upstream_timeout_s="1",
            first_token_timeout_s="1",
            upstream_timeouts_to_down="3",
            health_hold_s="60",
        )
        for stream in (False, True, False):
            status, _, payload = chat(gw, stream=stream)
            assert status == 504 and error_of(payload)["code"] == "upstream_timeout"
            assert "127.0.0.1" not in payload.decode()  # the upstream's name, never its URL
        assert inflight(gw) == 0
        state = get_json(f"{gw}/state")["upstreams"][0]
        assert not state["healthy"] and "timed out" in state["health_error"]
        # /health still answers, yet the poll does not bring it back within the hold
        status, headers, _ = chat(gw)
        assert status == 503 and headers.get("retry-after")
        outcomes = metric_value(
            f"{gw}/metrics", "sweetspot_upstream_requests_total", {"upstream": hung.url, "outcome": "timed_out"}
        )
        assert outcomes == 3


def test_a_stream_without_a_first_token_ends_with_an_error_event(processes) -> None:
    with fault_upstream("no_token") as upstream:
        gw = gateway(processes, [upstream], first_token_timeout_s="1", stream_idle_timeout_s="30")
        status, _, payload = chat(gw, stream=True)
        assert status == 200
        assert sse_events(payload)[-1]["error"]["code"] == "upstream_timeout"
        assert inflight(gw) == 0


def test_a_stream_that_goes_silent_ends_with_an_error_event(processes) -> None:
    with fault_upstream("stall") as upstream:
        gw = gateway(processes, [upstream], stream_idle_timeout_s="1")
        status, _, payload = chat(gw, stream=True)
        events = sse_events(payload)
        assert status == 200 and events[0]["choices"][0]["delta"]["content"] == "hello"
        assert events[-1]["error"]["code"] == "upstream_timeout"
        assert wait_for(lambda: inflight(gw) == 0)


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
