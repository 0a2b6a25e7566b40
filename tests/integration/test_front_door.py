"""The front door of a real gateway process: head size and read timeouts, the connection cap, what a client's
headers may carry and what it is told."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from testbed.fault_upstream import MODEL, FaultUpstream, fault_upstream
from testbed.gateway import start_gateway

KEY, ADMIN = "client-key", "admin-key"
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with fault_upstream("ok") as server:
        yield server


@pytest.fixture(scope="module")
def gateway(module_processes, upstream: FaultUpstream):  # type: ignore[no-untyped-def]
    env = {
        "SWEETSPOT_API_KEYS": KEY,
        "SWEETSPOT_ADMIN_API_KEY": ADMIN,
        "SWEETSPOT_MAX_CONNECTIONS": "24",
        "SWEETSPOT_MAX_HEADER_BYTES": "16384",
        "SWEETSPOT_REQUEST_READ_TIMEOUT_S": "1",
        "SWEETSPOT_MAX_N": "4",
        "SWEETSPOT_MAX_BODY_BYTES": str(2 * 2**20),
    }
    return start_gateway(module_processes, [upstream.url], "--no-control", env=env)


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def request(
    url: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str | bytes] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*address(url), timeout=30)
    try:
        conn.putrequest(method, path)
        for name, value in {
            "content-type": "application/json",
            "authorization": f"Bearer {KEY}",
            **(headers or {}),
        }.items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("content-length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def raw(url: str, data: bytes, *, wait_s: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the gateway closes it."""
    with socket.create_connection(address(url), timeout=wait_s) as sock:
        sock.sendall(data)
        return read_to_close(sock)


def read_to_close(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def status_line(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> dict:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_an_oversized_head_gets_431_and_the_connection_closes(gateway) -> None:
    answer = raw(gateway.url, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 40_000 + b"\r\n\r\n")
    assert status_line(answer) == 431
    assert body_of(answer)["error"]["code"] == "headers_too_large"


def test_a_hundred_clients_sending_a_megabyte_of_headers_cost_little_memory(gateway) -> None:
    before = rss_mb(gateway.pid)
    sockets = [socket.create_connection(address(gateway.url), timeout=10) for _ in range(100)]
    try:
        for sock in sockets:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        piece = b"x-pad: " + b"p" * 65_000 + b"\r\n"
        for _ in range(16):  # up to a megabyte each, unless the gateway closes first
            for sock in sockets:
                with contextlib.suppress(OSError):  # the gateway closed this one
                    sock.sendall(piece)
        grown = rss_mb(gateway.pid) - before
    finally:
        for sock in sockets:
            sock.close()
    assert grown < 50, f"RSS grew by {grown:.0f} MB"


def test_a_head_sent_too_slowly_gets_408(gateway) -> None:
    with socket.create_connection(address(gateway.url), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # and nothing more
        started = time.monotonic()
        answer = read_to_close(sock)
    assert status_line(answer) == 408 and time.monotonic() - started < 5


def test_a_connection_that_sends_nothing_is_closed(gateway) -> None:
    with socket.create_connection(address(gateway.url), timeout=10) as sock:
        started = time.monotonic()
        answer = read_to_close(sock)
    assert time.monotonic() - started < 5 and (not answer or status_line(answer) == 408)


def test_a_body_sent_too_slowly_gets_408(gateway) -> None:
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {KEY}\r\ncontent-length: 100\r\n\r\n"
    ).encode()
    answer = raw(gateway.url, head + b'{"model":')
    assert status_line(answer) == 408 and body_of(answer)["error"]["code"] == "request_timeout"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize", "/detokenize", "/v1/messages/count_tokens"])
def test_a_body_trickled_to_any_route_gets_408_within_the_read_timeout(gateway, path: str) -> None:
    """One byte at a time, never finishing: every route that takes a body ends it at request_read_timeout_s
    (1 s here) with a 408 and closes the connection."""
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {KEY}\r\ncontent-length: 100\r\n\r\n"
    ).encode()
    with socket.create_connection(address(gateway.url), timeout=10) as sock:
        sock.sendall(head)
        started = time.monotonic()
        sock.settimeout(0.3)
        answer = b""
        for byte in b'{"model": "x", "prompt": "trickled one byte at a time"':
            with contextlib.suppress(OSError):
                sock.sendall(bytes([byte]))
            with contextlib.suppress(TimeoutError):
                answer = sock.recv(65536)
                if answer or time.monotonic() - started > 8:
                    break
        sock.settimeout(10)
        answer += read_to_close(sock)
    assert status_line(answer) == 408, answer[:200]
    assert time.monotonic() - started < 5
    assert "not received within" in body_of(answer)["error"]["message"]  # OpenAI's or Anthropic's shape


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize", "/v1/messages/count_tokens"])
def test_a_chunked_body_bomb_gets_413_as_the_limit_passes_and_costs_no_more_than_the_limit(gateway, path) -> None:
    """A chunked body (no length to refuse early) of 200 MB against a 2 MB limit: the answer comes once the
    limit is passed, and the gateway's memory grows by about the limit, not by what the client sends."""
    before = rss_mb(gateway.pid)
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {KEY}\r\ntransfer-encoding: chunked\r\n\r\n"
    ).encode()
    piece = b"x" * 65_536
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    sent = 0
    with socket.create_connection(address(gateway.url), timeout=10) as sock:
        sock.sendall(head)
        try:
            while sent < 200 * 2**20:
                sock.sendall(chunk)
                sent += len(piece)
        except OSError:
            pass  # the gateway answered and closed: the rest is never read
        answer = read_to_close(sock) if sent < 200 * 2**20 else b""
        grown = rss_mb(gateway.pid) - before
    assert sent < 20 * 2**20, f"the gateway read {sent / 2**20:.0f} MB of a body over its 2 MB limit"
    if answer:
        assert status_line(answer) == 413 and "exceeds" in body_of(answer)["error"]["message"]
    assert grown < 30, f"RSS grew by {grown:.0f} MB"


def test_connections_past_the_cap_get_503(gateway) -> None:
    held = []
    try:
        for _ in range(30):
            sock = socket.create_connection(address(gateway.url), timeout=10)
            held.append(sock)
        time.sleep(0.2)
        refused = [sock for sock in held if _closed_with(sock) == 503]
        assert len(refused) >= 6
    finally:
        for sock in held:
            sock.close()


def _closed_with(sock: socket.socket) -> int | None:
    sock.settimeout(0.2)
    try:
        data = sock.recv(4096)
    except TimeoutError:
        return None
    return status_line(data) if data else None


def test_request_ids_are_taken_only_when_short_and_printable(gateway, upstream: FaultUpstream) -> None:
    status, headers, _ = request(gateway.url, "POST", "/v1/chat/completions", CHAT, {"x-request-id": "abc-123"})
    assert status == 200 and headers["x-request-id"] == "abc-123"  # echoed; the gateway's own id goes upstream
    assert len(upstream.seen_headers[-1]["x-request-id"]) == 32
    status, headers, _ = request(gateway.url, "POST", "/v1/chat/completions", CHAT, {"x-request-id": "z" * 500})
    assert status == 200 and len(headers["x-request-id"]) == 32
    assert upstream.seen_headers[-1]["x-request-id"] == headers["x-request-id"]


@pytest.mark.parametrize("authorization", [b"Bearer \xe2\x82\xac", b"\xff\xfe", b"Bearer", b"Basic client-key"])
def test_a_malformed_authorization_is_a_401(gateway, authorization: bytes) -> None:
    status, _, payload = request(gateway.url, "POST", "/v1/chat/completions", CHAT, {"authorization": authorization})
    assert status == 401 and json.loads(payload)["error"]["code"] == "invalid_api_key"


def test_the_clients_key_never_goes_upstream(gateway, upstream: FaultUpstream) -> None:
    assert request(gateway.url, "POST", "/v1/chat/completions", CHAT)[0] == 200
    assert "authorization" not in upstream.seen_headers[-1]


def test_metrics_and_state_need_the_admin_key(gateway) -> None:
    for path in ("/metrics", "/state"):
        assert request(gateway.url, "GET", path)[0] == 401
        assert request(gateway.url, "GET", path, headers={"authorization": f"Bearer {ADMIN}"})[0] == 200
    assert request(gateway.url, "GET", "/healthz")[0] == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_declared_json_gets_415(gateway, content_type: str) -> None:
    status, _, payload = request(gateway.url, "POST", "/v1/chat/completions", CHAT, {"content-type": content_type})
    assert status == 415 and json.loads(payload)["error"]["code"] == "unsupported_media_type"


def test_n_is_capped(gateway) -> None:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 100}).encode()
    status, _, payload = request(gateway.url, "POST", "/v1/chat/completions", body)
    assert status == 400 and json.loads(payload)["error"]["param"] == "n"


def test_errors_name_the_upstream_never_its_url(processes) -> None:
    with fault_upstream("ok") as doomed:
        gw = start_gateway(processes, [doomed.url], "--no-control").url
        doomed.close()
        port = str(address(doomed.url)[1])
        answers = [request(gw, "POST", "/v1/chat/completions", CHAT) for _ in range(3)]
        assert [status for status, _, _ in answers] == [502, 503, 503]  # refused, then taken out
        assert "upstream-1" in answers[0][2].decode()
        for _, _, payload in answers:
            assert port not in payload.decode() and "127.0.0.1" not in payload.decode()
        status, _, payload = request(gw, "GET", "/readyz")  # ready: the gateway answers, with 503s above
        assert status == 200 and json.loads(payload)["any_upstream_healthy"] is False
        assert port not in payload.decode()
