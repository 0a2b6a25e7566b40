"""Operational hardening, against real gateway processes: a stop that reaches every worker twice still drains,
light requests drain too, stored responses stay with the tenant that made them, and a loopback gateway without
keys answers only loopback names (DNS rebinding)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.parse
from pathlib import Path

import httpx

from testbed.fault_upstream import MODEL as FAULT_MODEL
from testbed.fault_upstream import fault_upstream, wait_for
from testbed.gateway import assert_openai_error, start_gateway, start_sim

CHAT = [{"role": "user", "content": "hello"}]
STOP_GRACE_S = 5.0  # what uvicorn's shutdown leaves running requests (asgi_server: timeout_graceful_shutdown)
LIGHT_DELAY_S = 12.0  # longer than that: a stop at once, or a drain that forgot them, would cut them
STREAM_TOKENS = 400  # at the simulator's pace with 8 streams, longer than STOP_GRACE_S too


def children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def inflight_by_process(url: str) -> set[int]:
    seen = set()
    for _ in range(20):
        with httpx.Client(timeout=10) as client:
            state = client.get(f"{url}/state").json()
        if any(upstream["inflight"] > 0 for upstream in state["upstreams"]):
            seen.add(int(state["process"]))
    return seen


def model_of(url: str) -> str:
    return str(httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"])


# ---- a stop that reaches every process of the unit ---------------------------------------------------


def test_a_stop_sent_to_every_process_of_the_unit_drains_streams_and_light_requests(processes) -> None:
    """systemd's default KillMode=control-group sends SIGTERM to every process of the unit: each worker gets
    its own and the parent's forward of the parent's. One stop, whoever sends it, is a drain: the streams and
    the light requests (no permit) running on both workers finish, and every process exits 0."""
    sim = start_sim(processes, time_scale=1.0)
    with fault_upstream(f"delay:{LIGHT_DELAY_S}") as slow:
        proc = start_gateway(
            processes,
            [sim.url, slow.url],
            "--workers",
            "2",
            "--no-control",
            "--initial-limit",
            "8",
            env={"SWEETSPOT_DRAIN_TIMEOUT_S": "60"},
        )
        model = model_of(sim.url)
        workers = children(proc.popen.pid)
        assert len(workers) == 2
        streamed: list[int] = []
        tokenized: list[int] = []

        def stream() -> None:
            body = {"model": model, "messages": CHAT, "stream": True, "max_tokens": STREAM_TOKENS, "ignore_eos": True}
            with (
                httpx.Client(timeout=120) as client,
                client.stream("POST", f"{proc.url}/v1/chat/completions", json=body) as reply,
            ):
                done = any(line.strip() == "data: [DONE]" for line in reply.iter_lines())
                streamed.append(reply.status_code if done else -1)

        def tokenize() -> None:
            with httpx.Client(timeout=60) as client:  # a connection of its own: the kernel picks the worker
                reply = client.post(f"{proc.url}/tokenize", json={"model": FAULT_MODEL, "prompt": "hello"})
            tokenized.append(reply.status_code)

        threads = [threading.Thread(target=stream, daemon=True) for _ in range(8)]
        threads += [threading.Thread(target=tokenize, daemon=True) for _ in range(4)]
        for thread in threads:
            thread.start()
        assert wait_for(lambda: inflight_by_process(proc.url) >= workers, 30)  # streams on both workers
        assert wait_for(lambda: slow.deliveries == 4, 30)  # and every light request reached its upstream

        for pid in workers:
            os.kill(pid, signal.SIGTERM)  # each worker, as a cgroup-wide stop sends it
        # Two SIGTERMs pending at once merge into one: let each worker take the first before the parent's comes.
        time.sleep(0.5)
        os.killpg(proc.popen.pid, signal.SIGTERM)  # the parent's process group (the workers have their own)

        for thread in threads:
            thread.join(120)
        assert proc.popen.wait(90) == 0, proc.output()[-3000:]
    assert streamed == [200] * 8
    assert tokenized == [200] * 4


def test_a_light_request_running_when_the_drain_begins_finishes(processes) -> None:
    """A tokenize (no permit) that is running when SIGTERM comes is answered; one that comes after is a 503."""
    with fault_upstream(f"delay:{LIGHT_DELAY_S / 2}") as slow:
        proc = start_gateway(processes, [slow.url], env={"SWEETSPOT_DRAIN_TIMEOUT_S": "60"})
        answers: list[httpx.Response] = []
        thread = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"{proc.url}/tokenize", json={"model": FAULT_MODEL, "prompt": "hi"}, timeout=60)
            ),
            daemon=True,
        )
        thread.start()
        assert wait_for(lambda: slow.deliveries == 1, 30)
        proc.popen.send_signal(signal.SIGTERM)
        assert wait_for(lambda: httpx.get(f"{proc.url}/readyz", timeout=5).status_code == 503, 5)
        late = httpx.post(f"{proc.url}/tokenize", json={"model": FAULT_MODEL, "prompt": "hi"}, timeout=10)
        assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
        thread.join(60)
        assert [a.status_code for a in answers] == [200]
        assert proc.popen.wait(30) == 0


# ---- stored responses belong to their tenant --------------------------------------------------------

TENANTS = [{"name": "alpha", "api_keys": ["key-alpha"]}, {"name": "beta", "api_keys": ["key-beta"]}]


def as_tenant(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_a_stored_response_is_its_tenants_only(processes) -> None:
    sim = start_sim(processes, time_scale=20.0)
    proc = start_gateway(processes, [sim.url], env={"SWEETSPOT_TENANTS": json.dumps(TENANTS)})
    gw, model = proc.url, model_of(sim.url)
    alpha, beta = as_tenant("key-alpha"), as_tenant("key-beta")
    with httpx.Client(timeout=60) as client:
        created = client.post(
            f"{gw}/v1/responses", json={"model": model, "input": "hello", "max_output_tokens": 4}, headers=alpha
        )
        assert created.status_code == 200, created.text
        rid = created.json()["id"]

        assert client.get(f"{gw}/v1/responses/{rid}", headers=alpha).json()["id"] == rid
        # To another tenant the id does not exist: not to read, delete, cancel or continue.
        for method, path in (("GET", rid), ("DELETE", rid), ("POST", f"{rid}/cancel")):
            other = client.request(method, f"{gw}/v1/responses/{path}", headers=beta)
            assert other.status_code == 404, (method, other.text)
            error = assert_openai_error(other.json()["error"])
            assert (error["code"], error["param"]) == ("response_not_found", "response_id")
        hijack = client.post(
            f"{gw}/v1/responses",
            json={"model": model, "input": "and then?", "max_output_tokens": 4, "previous_response_id": rid},
            headers=beta,
        )
        assert hijack.status_code == 404, hijack.text
        error = assert_openai_error(hijack.json()["error"])
        assert (error["code"], error["param"]) == ("response_not_found", "previous_response_id")
        # Its own tenant continues it.
        follow = client.post(
            f"{gw}/v1/responses",
            json={"model": model, "input": "and then?", "max_output_tokens": 4, "previous_response_id": rid},
            headers=alpha,
        )
        assert follow.status_code == 200 and follow.json()["previous_response_id"] == rid, follow.text

        # A response the gateway did not see created (here: made on the backend directly) is nobody's.
        direct = httpx.post(f"{sim.url}/v1/responses", json={"model": model, "input": "x", "max_output_tokens": 2})
        unknown = direct.json()["id"]
        assert httpx.get(f"{sim.url}/v1/responses/{unknown}").status_code == 200
        for key in (alpha, beta):
            assert client.get(f"{gw}/v1/responses/{unknown}", headers=key).status_code == 404


def raw_request(url: str, method: str, target: str) -> tuple[int, dict]:
    """One request with its target sent byte for byte (an HTTP client would normalise ``..`` away)."""
    parsed = urllib.parse.urlsplit(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as sock:
        head = f"{method} {target} HTTP/1.1\r\nhost: {parsed.netloc}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        sock.sendall(head.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), json.loads(body)


def test_a_response_id_never_becomes_another_upstream_path(processes) -> None:
    """``/v1/responses/..`` would reach the upstream as ``/v1/`` once normalised: an id is a strict form."""
    with fault_upstream() as upstream:
        proc = start_gateway(processes, [upstream.url])
        for target in ("/v1/responses/../cancel", "/v1/responses/a.b/cancel", "/v1/responses/" + "x" * 129 + "/cancel"):
            status, body = raw_request(proc.url, "POST", target)
            assert status == 400, (target, body)
            assert assert_openai_error(body["error"])["param"] == "response_id"
        status, body = raw_request(proc.url, "GET", "/v1/responses/..")
        assert status == 400 and body["error"]["param"] == "response_id"
        assert upstream.deliveries == 0  # nothing reached the upstream
        # Without keys, an id the gateway does not know is still asked of the upstreams, as before.
        status, _ = raw_request(proc.url, "POST", "/v1/responses/resp_0123abcd/cancel")
        assert status == 200 and upstream.deliveries == 1


# ---- Host: DNS rebinding ----------------------------------------------------------------------------


def test_a_loopback_gateway_without_keys_answers_only_loopback_names(processes) -> None:
    sim = start_sim(processes, time_scale=20.0)
    proc = start_gateway(processes, [sim.url])
    port = proc.url.rsplit(":", 1)[1]
    with httpx.Client(timeout=10) as client:
        for path in ("/healthz", "/readyz", "/v1/models", "/state"):
            refused = client.get(f"{proc.url}{path}", headers={"host": "evil.example"})
            assert refused.status_code == 421, (path, refused.text)
            error = assert_openai_error(refused.json()["error"])
            assert error["code"] == "host_not_allowed"
            assert refused.headers["x-sweetspot-reason"] == "host_not_allowed"
        chat = client.post(
            f"{proc.url}/v1/chat/completions",
            json={"model": model_of(sim.url), "messages": CHAT, "max_tokens": 2},
            headers={"host": f"evil.example:{port}"},
        )
        assert chat.status_code == 421
        for host in (f"localhost:{port}", "localhost", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST."):
            assert client.get(f"{proc.url}/v1/models", headers={"host": host}).status_code == 200, host


def test_with_keys_or_allowed_hosts_the_host_check_follows_them(processes) -> None:
    sim = start_sim(processes, time_scale=20.0)
    keyed = start_gateway(processes, [sim.url], env={"SWEETSPOT_API_KEYS": "k1"})
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{keyed.url}/healthz", headers={"host": "evil.example"}).status_code == 200
        models = client.get(f"{keyed.url}/v1/models", headers={"host": "gateway.example", **as_tenant("k1")})
        assert models.status_code == 200
    hosts = "*.corp.example,gateway.test,127.0.0.1"  # 127.0.0.1: the test's own readiness probe
    listed = start_gateway(processes, [sim.url], env={"SWEETSPOT_ALLOWED_HOSTS": hosts})
    with httpx.Client(timeout=10) as client:
        for host, status in (
            ("gateway.test:8080", 200),
            ("api.corp.example", 200),
            ("corp.example", 421),
            ("localhost", 421),
            ("evil.example", 421),
        ):
            assert client.get(f"{listed.url}/healthz", headers={"host": host}).status_code == status, host
