"""Every API the backends speak, through the gateway: the Responses API and Anthropic's Messages API against a
real llama-server with the real OpenAI and Anthropic SDKs, the light routes, stored responses across two
upstreams (the simulator keeps them, as vLLM does), and each SDK's own retry of the gateway's 429."""

from __future__ import annotations

import json
import threading
import urllib.request

import anthropic
import httpx
import openai
import pytest

from gateway.sweep.driver import SweepConfig, run_sweep
from gateway.sweep.result import SLO
from gateway.sweep.workload import Workload, parse_length
from testbed.gateway import get_json, metric_value, start_gateway, start_sim
from testbed.llama import MODEL, start_llama_server

MESSAGE = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def llama(module_processes):  # type: ignore[no-untyped-def]
    return start_llama_server(module_processes)


@pytest.fixture(scope="module")
def gateway(module_processes, llama):  # type: ignore[no-untyped-def]
    return start_gateway(module_processes, [llama.url], "--no-control", "--initial-limit", "2")


def predicted(llama_url: str) -> float:
    value = metric_value(f"{llama_url}/metrics", "llamacpp:tokens_predicted_total")
    assert value is not None
    return value


def gateway_tokens(gw: str) -> float:
    return metric_value(f"{gw}/metrics", "sweetspot_output_tokens_total") or 0.0


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())


def test_responses_api_whole_and_streamed(gateway, llama) -> None:
    direct = openai.OpenAI(base_url=f"{llama.url}/v1", api_key="x", max_retries=0)
    through = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    expected = direct.responses.create(model=MODEL, input="hello there", max_output_tokens=8).usage
    before_llama, before_gw = predicted(llama.url), gateway_tokens(gateway.url)
    whole = through.responses.create(model=MODEL, input="hello there", max_output_tokens=8)
    assert whole.usage.input_tokens == expected.input_tokens and whole.output_text
    events = list(through.responses.create(model=MODEL, input="hello there", max_output_tokens=8, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    done = [e for e in events if e.type == "response.completed"][-1].response
    assert deltas and done.usage.input_tokens == expected.input_tokens
    produced = whole.usage.output_tokens + done.usage.output_tokens
    assert predicted(llama.url) - before_llama == produced == gateway_tokens(gateway.url) - before_gw
    assert [u["inflight"] for u in get_json(f"{gateway.url}/state")["upstreams"]] == [0]


def test_messages_api_whole_and_streamed(gateway, llama) -> None:
    direct = anthropic.Anthropic(base_url=llama.url, api_key="x", max_retries=0)
    through = anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0)
    expected = direct.messages.create(model=MODEL, max_tokens=8, messages=MESSAGE).usage
    prompt = expected.input_tokens + (expected.cache_read_input_tokens or 0)
    before_llama, before_gw = predicted(llama.url), gateway_tokens(gateway.url)
    whole = through.messages.create(model=MODEL, max_tokens=8, messages=MESSAGE)
    assert whole.content[0].text
    assert whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0) == prompt
    with through.messages.stream(model=MODEL, max_tokens=8, messages=MESSAGE) as stream:
        text = stream.get_final_text()
        final = stream.get_final_message()
    assert text and final.usage.output_tokens >= 1
    produced = whole.usage.output_tokens + final.usage.output_tokens
    assert predicted(llama.url) - before_llama == produced == gateway_tokens(gateway.url) - before_gw
    requests = metric_value(
        f"{gateway.url}/metrics", "sweetspot_requests_total", {"route": "/v1/messages", "status": "200"}
    )
    assert requests is not None and requests >= 2


def test_light_routes_answer_as_the_backend_does(gateway, llama) -> None:
    assert post(f"{gateway.url}/tokenize", {"content": "hello world"}) == post(
        f"{llama.url}/tokenize", {"content": "hello world"}
    )
    through = anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0)
    direct = anthropic.Anthropic(base_url=llama.url, api_key="x", max_retries=0)
    assert (
        through.messages.count_tokens(model=MODEL, messages=MESSAGE).input_tokens
        == direct.messages.count_tokens(model=MODEL, messages=MESSAGE).input_tokens
    )


def test_other_backend_routes_stay_closed(gateway) -> None:
    response = httpx.post(f"{gateway.url}/slots", json={})
    assert response.status_code in (404, 405) and "error" in response.json()


def test_a_conversation_continues_on_the_upstream_that_holds_it(processes) -> None:
    """Stored responses live on the upstream that made them: previous_response_id and GET by id go there."""
    sims = [start_sim(processes, time_scale=20.0) for _ in range(2)]
    gw = start_gateway(processes, [sim.url for sim in sims], "--no-control", "--initial-limit", "4").url
    model = str(get_json(f"{sims[0].url}/v1/models")["data"][0]["id"])
    client = openai.OpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=0)
    for _ in range(3):  # three conversations: they start on whichever upstream is freer
        previous = None
        for turn in range(4):
            reply = client.responses.create(
                model=model, input=f"turn {turn}", max_output_tokens=4, previous_response_id=previous
            )
            previous = reply.id
        assert client.responses.retrieve(previous).id == previous
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp-unknown")


def test_each_sdk_retries_the_gateways_429_on_its_own_terms(processes) -> None:
    """A full queue answers 429 with Retry-After in the client's dialect; each SDK waits it out and retries."""
    sim = start_sim(processes, time_scale=0.05)  # the stream that holds the only permit lasts
    gw = start_gateway(processes, [sim.url], "--no-control", "--initial-limit", "1", "--max-queue", "0").url
    model = str(get_json(f"{sim.url}/v1/models")["data"][0]["id"])
    holding = threading.Event()

    def hold() -> None:
        body = {"model": model, "messages": MESSAGE, "max_tokens": 400, "stream": True, "ignore_eos": True}
        try:
            with httpx.stream("POST", f"{gw}/v1/chat/completions", json=body, timeout=120) as response:
                holding.set()
                for _ in response.iter_bytes():
                    pass
        except httpx.HTTPError:
            pass  # the processes stop when the test ends, mid-stream

    threading.Thread(target=hold, daemon=True).start()
    assert holding.wait(30)
    rejected = metric_value(f"{gw}/metrics", "sweetspot_rejections_total", {"reason": "queue_full"}) or 0.0
    with pytest.raises(anthropic.RateLimitError) as refused:
        anthropic.Anthropic(base_url=gw, api_key="x", max_retries=1).messages.create(
            model=model, max_tokens=4, messages=MESSAGE
        )
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "rate_limit_error"
    assert refused.value.response.headers["retry-after"]
    with pytest.raises(openai.RateLimitError):
        openai.OpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=1).responses.create(
            model=model, input="hi", max_output_tokens=4
        )
    after = metric_value(f"{gw}/metrics", "sweetspot_rejections_total", {"reason": "queue_full"})
    assert after == rejected + 4  # each SDK asked twice: once, then once more after Retry-After


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_the_sweep_measures_these_apis_too(gateway, api: str) -> None:
    config = SweepConfig(
        url=gateway.url,
        api=api,
        levels=(2,),
        requests_per_level=8,  # type: ignore[arg-type]
        workload=Workload(
            api=api,
            prompt_len=parse_length(16),  # type: ignore[arg-type]
            output_len=parse_length(16),
        ),
        slo=SLO(),
        early_stop=False,
    )
    level = (await run_sweep(config)).levels[0]
    assert level.completed > 0 and not level.failed, level.error_samples
    assert level.token_counting == "usage" and level.output_tokens_per_s > 0
    assert level.ttft_ms.p50 is not None and level.tpot_ms.p50 is not None


def test_a_listed_passthrough_path_reaches_the_backend(module_processes, llama) -> None:
    gw = start_gateway(
        module_processes, [llama.url], "--no-control", env={"SWEETSPOT_PASSTHROUGH_PATHS": "/slots,/props"}
    ).url
    slots = httpx.get(f"{gw}/slots", timeout=30)
    direct = httpx.get(f"{llama.url}/slots", timeout=30).json()
    assert slots.status_code == 200 and [s["id"] for s in slots.json()] == [s["id"] for s in direct]
    assert httpx.get(f"{gw}/props", timeout=30).status_code == 200
    assert httpx.get(f"{gw}/health/ready", timeout=30).status_code == 404  # not listed


def test_rerank_and_score_take_a_permit_and_are_measured(processes) -> None:
    """vLLM serves rerank and score for a cross-encoder (the simulator stands in): admitted like generation,
    their usage counted as prompt tokens, the permit back."""
    sim = start_sim(processes, time_scale=20.0)
    gw = start_gateway(processes, [sim.url], "--no-control").url
    model = str(get_json(f"{sim.url}/v1/models")["data"][0]["id"])
    ranked = httpx.post(
        f"{gw}/v1/rerank", json={"model": model, "query": "cats", "documents": ["dogs", "cats"]}, timeout=30
    ).json()
    assert sorted(r["index"] for r in ranked["results"]) == [0, 1] and ranked["usage"]["total_tokens"] > 0
    scored = httpx.post(
        f"{gw}/v1/score", json={"model": model, "text_1": "cats", "text_2": ["dogs", "cats"]}, timeout=30
    ).json()
    assert len(scored["data"]) == 2
    missing = httpx.post(f"{gw}/v1/rerank", json={"model": model, "query": "cats"}, timeout=30)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "documents"
    for route in ("/v1/rerank", "/v1/score"):
        assert metric_value(f"{gw}/metrics", "sweetspot_requests_total", {"route": route, "status": "200"}) == 1
    prompt = metric_value(f"{gw}/metrics", "sweetspot_prompt_tokens_total")
    assert prompt is not None and prompt >= ranked["usage"]["total_tokens"]
    assert [u["inflight"] for u in get_json(f"{gw}/state")["upstreams"]] == [0]
