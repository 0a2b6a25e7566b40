"""What anyone who can reach the gateway learns, how long a stream may run, whose request id goes upstream, and
how much one unfinished event may cost: a real gateway process in front of upstreams that misbehave on purpose
(:mod:`testbed.fault_upstream`)."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gateway.common.processes import RunningProcess
from testbed.fault_upstream import MODEL, NO_SEPARATOR_MAX, SLOW_TOKENS, FaultUpstream, fault_upstream
from testbed.gateway import get_json, metric_value, start_gateway, wait_for

CHAT = [{"role": "user", "content": "hi"}]
# Short bounds, each apart from the others: a stream that lasts past the total bound, and waits for its headers
# or its first token past the idle bound, must still run whole.
UPSTREAM_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 1.5
FIRST_TOKEN_TIMEOUT_S = 5.0


def post(
    url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """POST and read the whole answer (a stream to its end)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)
    try:
        conn.request("POST", path, json.dumps(body), {"content-type": "application/json", **(headers or {})})
        reply = conn.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        conn.close()


def chat(url: str, *, stream: bool, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    return post(url, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "stream": stream}, headers)


def events(payload: bytes) -> list[bytes]:
    return [event for event in payload.split(b"\n\n") if event.strip()]


def data_of(event: bytes) -> Any:
    assert event.startswith(b"data: "), event[:200]
    text = event[6:]
    return text.decode() if text == b"[DONE]" else json.loads(text)


def contents(payload: bytes) -> list[str]:
    """The generated text of each chunk of a chat stream."""
    out = []
    for event in events(payload):
        chunk = data_of(event)
        if isinstance(chunk, dict):
            out += [choice["delta"]["content"] for choice in chunk.get("choices", []) if "content" in choice["delta"]]
    return out


def outcomes(gw: str, upstream: FaultUpstream) -> dict[str, float]:
    found = {}
    for outcome in ("ok", "timed_out", "upstream_error", "client_cancelled"):
        value = metric_value(
            f"{gw}/metrics", "sweetspot_upstream_requests_total", {"upstream": upstream.url, "outcome": outcome}
        )
        if value:
            found[outcome] = value
    return found


def inflight(gw: str) -> int:
    return sum(u["inflight"] for u in get_json(f"{gw}/state")["upstreams"])


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM): what a stream cost at its worst, after it ended."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def settings_env(**settings: str) -> dict[str, str]:
    return {f"SWEETSPOT_{key.upper()}": value for key, value in settings.items()}


# /readyz


def test_readyz_names_no_host_and_state_keeps_the_detail(processes) -> None:
    """/readyz answers anyone who can reach the gateway: each upstream by its public name, its error in words
    that name no host or port. /state (admin-only once an admin key is set) keeps the URL and the exception's
    own words."""
    with fault_upstream("ok") as doomed:
        gw = start_gateway(processes, [doomed.url], "--no-control", env=settings_env(health_interval_s="0.2")).url
        doomed.close()
        host, port = urlsplit(doomed.url).hostname or "", str(urlsplit(doomed.url).port)

        def polled() -> dict | None:
            body = get_json(f"{gw}/readyz")
            error = body["upstreams"]["upstream-1"]["error"] or ""
            return body if error.startswith("/health") else None  # the health poll's own error, not the path's

        body = wait_for(polled, 10, "the health poll's error on /readyz")
        assert body["upstreams"] == {"upstream-1": {"healthy": False, "error": "/health failed: ClientConnectorError"}}
        text = json.dumps(body)
        assert host not in text and port not in text and "http" not in text, text
        (entry,) = get_json(f"{gw}/state")["upstreams"]
        assert entry["url"] == doomed.url and entry["health_error"] == "/health failed: ClientConnectorError"
        assert port in entry["health_detail"]


# How long a stream may run


@pytest.fixture(scope="module")
def timed() -> Iterator[FaultUpstream]:
    with fault_upstream("ok") as server:
        yield server


@pytest.fixture(scope="module")
def timed_gateway(module_processes, timed: FaultUpstream) -> str:
    env = settings_env(
        upstream_timeout_s=str(UPSTREAM_TIMEOUT_S),
        stream_idle_timeout_s=str(IDLE_TIMEOUT_S),
        first_token_timeout_s=str(FIRST_TOKEN_TIMEOUT_S),
        upstream_timeouts_to_down="1000",  # the timeouts here are on purpose: the upstream stays in rotation
    )
    return start_gateway(module_processes, [timed.url], "--no-control", env=env).url


def test_a_stream_that_keeps_producing_runs_past_upstream_timeout_s(timed_gateway: str, timed: FaultUpstream) -> None:
    """A stream is bounded by its first token and its silences, never by a total: one that sends a token every
    0.5 s for 4 s, twice the total bound, arrives whole and counts ok (not a timeout, not congestion)."""
    timed.mode = "slow_stream"
    before = outcomes(timed_gateway, timed)
    status, _, payload = chat(timed_gateway, stream=True)
    assert status == 200
    assert contents(payload) == [f" {index}" for index in range(SLOW_TOKENS)]
    assert data_of(events(payload)[-1]) == "[DONE]"
    after = outcomes(timed_gateway, timed)
    assert after.get("ok", 0) == before.get("ok", 0) + 1 and after.get("timed_out") == before.get("timed_out"), after


def test_a_whole_answer_keeps_its_total_bound(timed_gateway: str, timed: FaultUpstream) -> None:
    timed.mode = f"delay:{UPSTREAM_TIMEOUT_S + 2}"
    status, _, payload = chat(timed_gateway, stream=False)
    assert status == 504 and json.loads(payload)["error"]["code"] == "upstream_timeout"
    assert inflight(timed_gateway) == 0


@pytest.mark.parametrize("mode", [f"delay:{IDLE_TIMEOUT_S + 1.5}", f"late_token:{IDLE_TIMEOUT_S + 1.5}"])
def test_a_streams_headers_and_first_token_wait_under_first_token_timeout_s(
    timed_gateway: str, timed: FaultUpstream, mode: str
) -> None:
    """The upstream's queue and prefill are no silence: headers, or a first token, that come later than the idle
    bound but within the first-token bound begin a stream that runs whole."""
    timed.mode = mode
    status, _, payload = chat(timed_gateway, stream=True)
    assert status == 200 and contents(payload) == ["hello"], payload[:500]
    assert data_of(events(payload)[-1]) == "[DONE]"


def test_a_streams_headers_later_than_first_token_timeout_s_get_504(timed_gateway: str, timed: FaultUpstream) -> None:
    timed.mode = f"delay:{FIRST_TOKEN_TIMEOUT_S + 5}"
    status, _, payload = chat(timed_gateway, stream=True)
    assert status == 504 and json.loads(payload)["error"]["code"] == "upstream_timeout"
    assert inflight(timed_gateway) == 0


@pytest.mark.parametrize(
    ("mode", "message"),
    [("stall", "the upstream went silent mid-stream"), ("no_token", "the upstream produced no token in time")],
)
def test_a_stream_still_ends_at_its_first_token_and_idle_bounds(
    timed_gateway: str, timed: FaultUpstream, mode: str, message: str
) -> None:
    """A token then silence ends at the idle bound; headers and no token end at the first-token bound: each with
    an error event, the permit back, counted as a timeout."""
    timed.mode = mode
    before = outcomes(timed_gateway, timed).get("timed_out", 0)
    status, _, payload = chat(timed_gateway, stream=True)
    assert status == 200
    error = data_of(events(payload)[-1])["error"]
    assert error["code"] == "upstream_timeout" and error["message"] == message, error
    assert wait_for(lambda: inflight(timed_gateway) == 0, 5, "the permit back")
    assert outcomes(timed_gateway, timed).get("timed_out", 0) == before + 1


# Request ids


def test_the_upstream_gets_the_gateways_own_request_id_and_the_client_its_own_back(processes) -> None:
    """Two tenants that send the same X-Request-Id must not collide inside vLLM, which takes the header as its
    request id: each request goes upstream with an id of the gateway's own; the client gets its own id back, and
    the access log has both."""
    with fault_upstream("ok") as upstream:
        proc = start_gateway(processes, [upstream.url], "--no-control", "--log-level", "info")
        for stream in (False, True, False, True):
            status, headers, _ = chat(proc.url, stream=stream, headers={"x-request-id": "same-id"})
            assert status == 200 and headers["x-request-id"] == "same-id"
        sent = [seen["x-request-id"] for seen in upstream.seen_headers]
        assert len(set(sent)) == 4 and all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in sent), sent

        def access_lines() -> list[dict]:
            records = [json.loads(line) for line in proc.output().splitlines() if line.startswith("{")]
            lines = [r for r in records if r.get("logger") == "sweetspot.access"]
            return lines if len(lines) >= 4 else []

        lines = wait_for(access_lines, 10, "four access lines")
        assert sorted((line["request_id"], line["client_request_id"]) for line in lines) == sorted(
            (rid, "same-id") for rid in sent
        )
        status, headers, _ = chat(proc.url, stream=False)  # none sent: the gateway's own, echoed and sent upstream
        assert headers["x-request-id"] == upstream.seen_headers[-1]["x-request-id"]


# An event that never ends

BOUND = 4 * 1024 * 1024


@pytest.mark.parametrize(
    ("path", "fields"),
    [("/v1/chat/completions", {"messages": CHAT}), ("/v1/responses", {"input": "hi"})],
)
def test_an_event_that_never_ends_is_cut_at_the_bound(processes, path: str, fields: dict[str, Any]) -> None:
    """An upstream streaming data that never ends an event (no blank line, up to 512 MiB): the gateway keeps at
    most the bound, then ends the stream with an error event in the client's dialect, hangs up on the upstream,
    gives the permit back and counts an upstream error. Its peak memory grows by a few times the bound, not by
    what the upstream would have sent."""
    with fault_upstream("no_separator") as upstream:
        proc: RunningProcess = start_gateway(
            processes, [upstream.url], "--no-control", env=settings_env(max_response_bytes=str(BOUND))
        )
        gw = proc.url
        chat(gw, stream=False)  # the first request's own one-off costs, before the peak is read
        peak_before = peak_rss_mb(proc.pid)
        status, _, payload = post(gw, path, {"model": MODEL, "stream": True, **fields})
        grown = peak_rss_mb(proc.pid) - peak_before
        assert status == 200
        last = events(payload)[-1]
        if path == "/v1/responses":  # the Responses API's error event, after the unfinished event was ended
            assert last.startswith(b"event: error\ndata: "), last[:200]
            error = json.loads(last.split(b"data: ", 1)[1])
        else:  # a chat stream's unfinished event was never passed on: the error is all the client got
            assert len(events(payload)) == 1
            error = data_of(last)["error"]
        assert error["code"] == "upstream_event_too_large" and str(BOUND) in error["message"], error
        assert upstream.endless_sent < 8 * BOUND < NO_SEPARATOR_MAX  # the gateway hung up soon after the bound
        assert grown < 64, f"peak RSS grew {grown:.0f} MB for a {BOUND >> 20} MiB bound"
        assert wait_for(lambda: inflight(gw) == 0, 5, "the permit back")
        assert outcomes(gw, upstream).get("upstream_error") == 1
