"""A real vLLM that is not up yet, then comes up, then dies under a stream: what the gateway's clients see.

One vLLM process for the module, on a port fixed in advance so the gateway can be started first. vLLM opens
its HTTP port only once its engine is ready (tens of seconds of profiling and compiling here), so while it
loads the gateway finds nothing listening: ``/readyz`` says no upstream is healthy (the gateway itself stays
ready: a pool that is down is an alert, not a reason to take every gateway out of its Service) and requests
get 503 ``no_upstream`` with ``Retry-After``, which the OpenAI SDK's own retries ride out until vLLM serves.
Then vLLM is killed (SIGKILL to its whole process group: API server, engine core and worker) in the middle of
a stream: the client gets an OpenAI-shaped error event, the permit is released and the upstream is marked down.
"""

from __future__ import annotations

import os
import signal

import httpx
import openai
import pytest

from testbed.gateway import assert_openai_error, get, get_json, metric_value, start_gateway, wait_for
from testbed.vllm import MODEL, start_vllm, vllm_config

FAST_HEALTH = {"SWEETSPOT_HEALTH_INTERVAL_S": "0.2", "SWEETSPOT_METRICS_INTERVAL_S": "0.5"}
CHAT = [{"role": "user", "content": "Say something."}]


def test_gateway_before_vllm_refuses_with_retry_after_then_serves_then_survives_its_death(processes) -> None:
    config = vllm_config(max_num_seqs=4, num_gpu_blocks=96)
    url = config.base_url
    gateway = start_gateway(processes, [url], "--no-control", "--initial-limit", "4", env=FAST_HEALTH, ready=False).url
    status, body = get(f"{gateway}/readyz")
    assert status == 200 and body["any_upstream_healthy"] is False

    server = start_vllm(processes, config, ready=False)
    answers: list[httpx.Response] = []

    def record(response: httpx.Response) -> None:
        response.read()
        answers.append(response)

    # Retry-After is 2 s and vLLM takes tens of seconds to load: enough retries to outlast any loading time the
    # fixture allows (start_vllm's 420 s).
    client = openai.OpenAI(
        base_url=f"{gateway}/v1",
        api_key="unused",
        max_retries=250,
        timeout=120,
        http_client=httpx.Client(event_hooks={"response": [record]}),
    )
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 4
    assert server.alive()
    assert answers[-1].status_code == 200
    refusals = answers[:-1]
    assert refusals, "the first answer came after vLLM was up; the loading window was missed"
    print(f"refused {len(refusals)} time(s) while vLLM loaded, then served")
    for answer in refusals:
        assert answer.status_code == 503
        assert assert_openai_error(answer.json()["error"])["code"] == "no_upstream"
        assert answer.headers["retry-after"] == "2"
    wait_for(lambda: get(f"{gateway}/readyz")[1]["any_upstream_healthy"], 10, "the upstream healthy once vLLM serves")

    # --- vLLM killed mid-stream ---
    stream = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=120).completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=1500, stream=True, extra_body={"ignore_eos": True}
    )
    received = 0
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            received += sum(1 for c in chunk.choices if c.text)
            if received == 1:
                # At the first token: the small model decodes thousands of tokens a second here, so waiting for
                # more can find the whole answer generated and on its way before the kill lands.
                os.killpg(server.pid, signal.SIGKILL)  # API server, engine core and worker: no goodbye
    assert 1 <= received < 1500
    assert assert_openai_error(err.value.body)["code"] == "upstream_disconnected"
    state = lambda: get_json(f"{gateway}/state")["upstreams"][0]  # noqa: E731
    wait_for(lambda: state()["inflight"] == 0, 5, "the permit released")
    assert (
        metric_value(
            f"{gateway}/metrics", "sweetspot_upstream_requests_total", {"upstream": url, "outcome": "upstream_error"}
        )
        == 1
    )
    status, body = wait_for(
        lambda: (r := get(f"{gateway}/readyz"))[1]["any_upstream_healthy"] is False and r,
        10,
        "the upstream marked down",
    )
    assert status == 200 and body["upstreams"]["upstream-1"]["error"]
    with pytest.raises(openai.InternalServerError) as refused:
        openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0).chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2
        )
    assert refused.value.status_code == 503
    assert assert_openai_error(refused.value.body)["code"] == "no_upstream"
    assert refused.value.response.headers.get("retry-after") == "2"
