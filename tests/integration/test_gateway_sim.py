"""The gateway under uvicorn in front of the simulator, driven by the real OpenAI SDK.

Each test asserts what a client or an operator would observe: identical content, usage only when
asked, 429 + Retry-After honoured by the SDK, hang-ups reaching the backend, errors in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request

import httpx
import openai
import pytest

from testbed.gateway import get_json, metric_value, start_gateway, start_sim

CHAT = [{"role": "user", "content": "Tell me about continuous batching."}]


@pytest.fixture(scope="module")
def sim(module_processes):
    return start_sim(module_processes, "--seed", "1", time_scale=10.0).url


@pytest.fixture(scope="module")
def gateway(module_processes, sim):
    return start_gateway(module_processes, [sim], "--initial-limit", "16", "--no-control").url


def client(base: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=kwargs.pop("api_key", "unused"), **kwargs)


def model_of(base: str) -> str:
    return client(base).models.list().data[0].id


def raw_post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict, dict]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def assert_openai_error(body: dict) -> dict:
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    return error


# --- transparency --------------------------------------------------------------------------------


def test_models_are_the_upstreams(sim, gateway) -> None:
    assert [m.id for m in client(gateway).models.list().data] == [m.id for m in client(sim).models.list().data]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_content_identical_to_direct(sim, gateway, stream) -> None:
    model = model_of(sim)
    outputs = []
    for base in (sim, gateway):
        kwargs = dict(model=model, messages=CHAT, max_tokens=24, extra_body={"ignore_eos": True})
        if stream:
            chunks = list(client(base).chat.completions.create(stream=True, **kwargs))
            outputs.append(
                (
                    "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                    [c.choices[0].finish_reason for c in chunks if c.choices][-1],
                )
            )
        else:
            reply = client(base).chat.completions.create(**kwargs)
            outputs.append(
                (
                    reply.choices[0].message.content,
                    reply.choices[0].finish_reason,
                    reply.usage.completion_tokens,
                    reply.usage.prompt_tokens,
                )
            )
    assert outputs[0] == outputs[1]
    assert outputs[0][1] == "length"


def test_completions_stream_identical_to_direct(sim, gateway) -> None:
    model = model_of(sim)
    texts = []
    for base in (sim, gateway):
        chunks = client(base).completions.create(
            model=model, prompt="Once upon a time", max_tokens=16, stream=True, extra_body={"ignore_eos": True}
        )
        texts.append("".join(c.choices[0].text for c in chunks if c.choices))
    assert texts[0] == texts[1] and texts[0]


def test_usage_chunk_only_when_asked(sim, gateway) -> None:
    model = model_of(sim)
    kwargs = dict(model=model, messages=CHAT, max_tokens=8, stream=True, extra_body={"ignore_eos": True})
    plain = list(client(gateway).chat.completions.create(**kwargs))
    assert all(chunk.usage is None for chunk in plain)
    assert all(chunk.choices for chunk in plain)
    asked = list(client(gateway).chat.completions.create(stream_options={"include_usage": True}, **kwargs))
    usage = [chunk.usage for chunk in asked if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 8
    # The gateway counted the same tokens whether or not the client saw them.
    state = get_json(f"{gateway}/state")["upstreams"][0]
    assert state["window"]["completed"] >= 2


def test_embeddings_pass_through(sim, gateway) -> None:
    model = model_of(sim)
    direct = client(sim).embeddings.create(model=model, input=["a", "b"])
    proxied = client(gateway).embeddings.create(model=model, input=["a", "b"])
    assert [d.embedding for d in direct.data] == [d.embedding for d in proxied.data]
    assert proxied.usage.prompt_tokens == direct.usage.prompt_tokens


def test_request_id_is_echoed_and_generated(gateway, sim) -> None:
    body = json.dumps({"model": model_of(sim), "messages": CHAT, "max_tokens": 2}).encode()
    status, headers, payload = raw_post(f"{gateway}/v1/chat/completions", body, {"x-request-id": "req-42"})
    assert status == 200 and headers.get("x-request-id") == "req-42"
    # The backend (vLLM's convention: chatcmpl-<X-Request-Id>) saw the gateway's own id, never the client's.
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", payload["id"]), payload["id"]
    status, headers, _ = raw_post(f"{gateway}/v1/chat/completions", body)
    assert status == 200 and len(headers.get("x-request-id", "")) >= 16


def test_streaming_is_not_buffered(sim, gateway) -> None:
    """The first chunk reaches the client long before the generation ends."""
    model = model_of(sim)
    started = time.perf_counter()
    stream = client(gateway).chat.completions.create(
        model=model, messages=CHAT, max_tokens=400, stream=True, extra_body={"ignore_eos": True}
    )
    first = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
    total = time.perf_counter() - started
    assert first is not None and (first - started) < total / 3


def test_streams_keep_their_connection_once_the_backend_is_recognised_as_vllm(gateway, sim) -> None:
    """The simulator shows vLLM's metrics: after a scrape the gateway stops asking it to close streams'
    connections, and streams on kept connections arrive whole, one after another."""
    deadline = time.monotonic() + 15
    while not get_json(f"{gateway}/state")["upstreams"][0]["streams_keep_alive"]:
        assert time.monotonic() < deadline, "the sim was not recognised as vLLM within 15 s"
        time.sleep(0.1)
    model = model_of(sim)
    for _ in range(5):
        chunks = client(gateway).chat.completions.create(
            model=model, messages=CHAT, max_tokens=8, stream=True, extra_body={"ignore_eos": True}
        )
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 8


def test_metrics_count_requests_tokens_and_latency(gateway, sim) -> None:
    model = model_of(sim)
    client(gateway).chat.completions.create(
        model=model, messages=CHAT, max_tokens=5, stream=True, extra_body={"ignore_eos": True}
    ).close()
    for _ in client(gateway).chat.completions.create(
        model=model, messages=CHAT, max_tokens=5, stream=True, extra_body={"ignore_eos": True}
    ):
        pass
    metrics = f"{gateway}/metrics"
    assert metric_value(metrics, "sweetspot_requests_total", {"route": "/v1/chat/completions", "status": "200"}) >= 1
    assert metric_value(metrics, "sweetspot_output_tokens_total", {"upstream": sim}) >= 5
    assert metric_value(metrics, "sweetspot_ttft_seconds_count", {"upstream": sim}) >= 1
    assert metric_value(metrics, "sweetspot_limit", {"upstream": sim}) == 16
    assert metric_value(metrics, "sweetspot_overhead_seconds_count") >= 1


# --- overload ------------------------------------------------------------------------------------


def _hold_slot(base: str, model: str, tokens: int) -> threading.Thread:
    def run() -> None:
        for _ in client(base).chat.completions.create(
            model=model, messages=CHAT, max_tokens=tokens, stream=True, extra_body={"ignore_eos": True}
        ):
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _wait_inflight(base: str, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if get_json(f"{base}/state")["upstreams"][0]["inflight"] >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"in-flight never reached {count}")


def test_full_queue_gives_429_that_the_sdk_retries_after_retry_after(processes, sim) -> None:
    gw = start_gateway(processes, [sim], "--initial-limit", "1", "--max-queue", "0", "--no-control").url
    model = model_of(sim)
    holder = _hold_slot(gw, model, tokens=1500)  # ~2 s: 75 tokens/s on a 10x time scale
    _wait_inflight(gw, 1)
    with pytest.raises(openai.RateLimitError) as info:
        client(gw, max_retries=0).chat.completions.create(model=model, messages=CHAT, max_tokens=2)
    response = info.value.response
    assert response.status_code == 429
    assert response.headers["x-sweetspot-reason"] == "queue_full"
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert_openai_error(response.json())
    # With retries, the SDK waits Retry-After and gets through once the slot frees.
    started = time.perf_counter()
    reply = client(gw, max_retries=5).chat.completions.create(model=model, messages=CHAT, max_tokens=2)
    assert reply.choices[0].message.content
    assert time.perf_counter() - started >= 0.9  # it waited at least one Retry-After second
    holder.join(30)
    assert metric_value(f"{gw}/metrics", "sweetspot_rejections_total", {"reason": "queue_full"}) >= 2


def test_client_gone_while_queued_never_reaches_the_upstream(processes) -> None:
    sim = start_sim(processes, time_scale=10.0).url
    gw = start_gateway(processes, [sim], "--initial-limit", "1", "--no-control").url
    model = model_of(sim)
    holder = _hold_slot(gw, model, tokens=1500)
    _wait_inflight(gw, 1)
    deadline = time.monotonic() + 10
    while metric_value(f"{sim}/metrics", "vllm:num_requests_running") != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    before = metric_value(f"{sim}/metrics", "vllm:prompt_tokens_total")  # the holder's prompt only
    assert before > 0

    async def queued_then_gone() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            task = asyncio.ensure_future(
                http.post(f"{gw}/v1/chat/completions", json={"model": model, "messages": CHAT, "max_tokens": 2})
            )
            for _ in range(100):
                await asyncio.sleep(0.02)
                if get_json(f"{gw}/state")["queue"]["depth"] == 1:
                    break
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(queued_then_gone())
    deadline = time.monotonic() + 5
    while get_json(f"{gw}/state")["queue"]["depth"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert get_json(f"{gw}/state")["queue"]["depth"] == 0
    holder.join(30)
    time.sleep(0.3)
    # Only the holder's prompt reached the simulator.
    after = metric_value(f"{sim}/metrics", "vllm:prompt_tokens_total")
    assert after == before
    assert metric_value(f"{gw}/metrics", "sweetspot_rejections_total", {"reason": "client_disconnected"}) == 1


def test_client_gone_while_sending_its_body_never_reaches_the_upstream(processes) -> None:
    """A client that hangs up halfway through its body is counted (499, client_disconnected) and nothing is
    sent upstream."""
    sim = start_sim(processes, time_scale=10.0).url
    gw = start_gateway(processes, [sim], "--no-control").url
    host, port = gw.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 4000\r\n\r\n" + b'{"model": "m", "messages": [' + b" " * 500
        )
        time.sleep(0.2)  # the gateway is reading the body now
    labels = {"route": "/v1/chat/completions", "status": "499"}
    deadline = time.monotonic() + 10
    while metric_value(f"{gw}/metrics", "sweetspot_requests_total", labels) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric_value(f"{gw}/metrics", "sweetspot_requests_total", labels) == 1
    assert metric_value(f"{gw}/metrics", "sweetspot_rejections_total", {"reason": "client_disconnected"}) == 1
    assert not metric_value(f"{sim}/metrics", "vllm:prompt_tokens_total")
    assert get_json(f"{gw}/state")["upstreams"][0]["inflight"] == 0


def test_client_hangup_mid_stream_aborts_upstream_and_frees_the_permit(processes) -> None:
    sim = start_sim(processes, time_scale=1.0).url
    gw = start_gateway(processes, [sim], "--initial-limit", "4", "--no-control").url
    model = model_of(sim)
    stream = client(gw).chat.completions.create(
        model=model, messages=CHAT, max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
    )
    for index, _ in enumerate(stream):
        if index == 5:
            break
    assert metric_value(f"{sim}/metrics", "vllm:num_requests_running") == 1
    stream.close()
    deadline = time.monotonic() + 1.0
    running = None
    while time.monotonic() < deadline:
        running = metric_value(f"{sim}/metrics", "vllm:num_requests_running")
        if running == 0:
            break
        time.sleep(0.05)
    assert running == 0, "the simulator still runs the abandoned sequence"
    assert get_json(f"{gw}/state")["upstreams"][0]["inflight"] == 0
    assert (
        metric_value(
            f"{gw}/metrics", "sweetspot_upstream_requests_total", {"upstream": sim, "outcome": "client_cancelled"}
        )
        == 1
    )


def test_upstream_killed_mid_stream_gives_an_error_event(processes) -> None:
    sim_proc = start_sim(processes, time_scale=1.0)
    sim = sim_proc.url
    gw = start_gateway(processes, [sim], "--initial-limit", "4", "--no-control").url
    model = model_of(sim)
    stream = client(gw, max_retries=0).chat.completions.create(
        model=model, messages=CHAT, max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
    )
    received = 0
    started = time.monotonic()
    with pytest.raises(openai.APIError) as info:
        for _ in stream:
            received += 1
            if received == 3:
                sim_proc.popen.kill()
    assert time.monotonic() - started < 15
    assert received >= 3
    assert "upstream" in str(info.value.message)
    assert get_json(f"{gw}/state")["upstreams"][0]["inflight"] == 0
    assert (
        metric_value(
            f"{gw}/metrics", "sweetspot_upstream_requests_total", {"upstream": sim, "outcome": "upstream_error"}
        )
        == 1
    )


# --- bad input -----------------------------------------------------------------------------------

BAD_INPUTS = [
    (b"{not json", 400, "invalid_json", None),
    (b"[1, 2]", 400, "invalid_json", None),
    (b"", 400, "invalid_json", None),
    (json.dumps({"messages": CHAT}).encode(), 400, "invalid_request", "model"),
    (json.dumps({"model": "MODEL"}).encode(), 400, "invalid_request", "messages"),
    (json.dumps({"model": "MODEL", "messages": "hi"}).encode(), 400, "invalid_request", "messages"),
    (
        json.dumps({"model": "MODEL", "messages": CHAT, "max_tokens": "ten"}).encode(),
        400,
        "invalid_request",
        "max_tokens",
    ),
    (json.dumps({"model": "MODEL", "messages": CHAT, "stream": "yes"}).encode(), 400, "invalid_request", "stream"),
    (json.dumps({"model": "no-such-model", "messages": CHAT}).encode(), 404, "model_not_found", "model"),
]


@pytest.mark.parametrize(("body", "status", "code", "param"), BAD_INPUTS)
def test_bad_input_gets_openai_shaped_errors(gateway, sim, body, status, code, param) -> None:
    body = body.replace(b"MODEL", model_of(sim).encode())
    got_status, headers, payload = raw_post(f"{gateway}/v1/chat/completions", body)
    assert got_status == status
    error = assert_openai_error(payload)
    assert error["code"] == code and error["param"] == param
    assert headers.get("x-sweetspot-reason")


def test_unknown_route_is_an_openai_404(gateway) -> None:
    status, _, payload = raw_post(f"{gateway}/v1/nothing-here", b"{}")
    assert status == 404 and assert_openai_error(payload)["code"] == "unknown_route"


def test_client_api_keys(processes, sim) -> None:
    gw = start_gateway(processes, [sim], "--no-control", env={"SWEETSPOT_API_KEYS": "k1,k2"}).url
    model = model_of(sim)
    with pytest.raises(openai.AuthenticationError) as info:
        client(gw, api_key="wrong").chat.completions.create(model=model, messages=CHAT, max_tokens=2)
    assert info.value.response.headers["x-sweetspot-reason"] == "unauthorized"
    assert_openai_error(info.value.response.json())
    reply = client(gw, api_key="k2").chat.completions.create(model=model, messages=CHAT, max_tokens=2)
    assert reply.choices[0].message.content
    with pytest.raises(openai.AuthenticationError):
        client(gw, api_key="nope").models.list()


def test_unknown_fields_pass_through_untouched(sim, gateway) -> None:
    """vLLM's stream_options.continuous_usage_stats reaches the backend: every chunk then carries usage."""
    model = model_of(sim)
    chunks = list(
        client(gateway).chat.completions.create(
            model=model,
            messages=CHAT,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True, "top_k": 5, "chat_template_kwargs": {"enable_thinking": False}},
        )
    )
    with_text = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(with_text) == 6
    assert all(c.usage is not None for c in with_text)
    assert [c.usage.completion_tokens for c in with_text] == [1, 2, 3, 4, 5, 6]


def test_upstream_key_replaces_the_clients(processes) -> None:
    """The backend requires a key (vLLM --api-key); clients use the gateway's own keys instead."""
    sim = start_sim(processes, "--api-key", "backend-secret", time_scale=10.0).url
    gw = start_gateway(
        processes,
        [sim],
        "--no-control",
        env={"SWEETSPOT_UPSTREAM_API_KEY": "backend-secret", "SWEETSPOT_API_KEYS": "client-key"},
    ).url
    with pytest.raises(openai.AuthenticationError):
        client(sim, api_key="client-key").models.list()  # the client's key is no good at the backend
    model = client(gw, api_key="client-key").models.list().data[0].id  # polled with the upstream key
    reply = client(gw, api_key="client-key").chat.completions.create(model=model, messages=CHAT, max_tokens=2)
    assert reply.choices[0].message.content
