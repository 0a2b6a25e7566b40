"""``sweetspot sim`` as a real process, driven by the real ``openai`` SDK and plain HTTP clients."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.common.processes import LISTENING, RunningProcess, start_process, sweetspot
from gateway.sim.exposition import TTFT_BUCKETS
from gateway.sim.profiles import QWEN36_35B_A3B_32GB

MODEL = QWEN36_35B_A3B_32GB.model


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningProcess]:
    cmd = sweetspot("sim", "--port", "0", "--time-scale", "20", "--admin", "--seed", "1")
    with start_process(cmd, ready_pattern=LISTENING, ready_url="{url}/health", timeout=60) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(sim: RunningProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def http(sim: RunningProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=60) as c:
        yield c


def metric_samples(http: httpx.Client) -> dict[str, list[Any]]:
    """Every sample of every family, keyed by sample name (``..._total``, ``..._bucket``...)."""
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    matching = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, (name, labels, samples.get(name))
    return matching[0]


def wait_for(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def test_models_lists_the_served_name(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "vllm"


def test_chat_non_stream_has_usage_and_length_finish(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something, anything."}],
        max_tokens=12,
        extra_body={"top_k": 5, "ignore_eos": True, "repetition_penalty": 1.1},  # vLLM extras are accepted
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert len(choice.message.content.split()) == 12
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 12
    assert resp.usage.prompt_tokens == 4 + math.ceil(len("Say something, anything.") / 4) + 3
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 12
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion"
    again = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say something, anything."}], max_tokens=12
    )
    assert again.choices[0].message.content == choice.message.content  # deterministic text


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to ten."}],
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 9  # one chunk per token, as vLLM streams
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 9 and last.usage.prompt_tokens > 0
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1


def test_stream_without_include_usage_sends_no_usage_chunk(http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert all('"usage"' not in e for e in events)
    assert len(events) == 1 + 3 + 1  # role, three tokens, [DONE]


def test_completions_with_token_id_prompt_count_exactly(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt=[7] * 300, max_tokens=5)
    assert resp.usage is not None and resp.usage.prompt_tokens == 300 and resp.usage.completion_tokens == 5
    assert resp.choices[0].finish_reason == "length" and resp.object == "text_completion"
    stream = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) == 4 and chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 4


def test_embeddings_are_deterministic_unit_vectors(client: openai.OpenAI) -> None:
    resp = client.embeddings.create(model=MODEL, input=["alpha", "beta"])  # the SDK asks for base64
    a, b = (d.embedding for d in resp.data)
    assert len(a) == QWEN36_35B_A3B_32GB.embedding_dim
    assert sum(x * x for x in a) == pytest.approx(1.0, rel=1e-4)
    assert a != b
    again = client.embeddings.create(model=MODEL, input="alpha", encoding_format="float")
    assert again.data[0].embedding == pytest.approx(a, rel=1e-6)
    assert resp.usage.prompt_tokens == 2 + 1  # a quarter of the UTF-8 bytes, rounded up: 5 -> 2, 4 -> 1


def test_errors_have_openai_shape(client: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="maximum context length is 4096"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5000)
    resp = http.post("/v1/chat/completions", content=b"{not json")
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == 400
    resp = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "n": 3})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "n"


def test_metrics_have_vllm_names_labels_and_buckets(client: openai.OpenAI, http: httpx.Client) -> None:
    client.completions.create(model=MODEL, prompt=[1] * 64, max_tokens=8)
    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_time_per_output_token_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram",
        "vllm:iteration_tokens_total": "histogram",
        "vllm:cache_config_info": "gauge",
    }
    for name, kind in expected.items():
        assert name in families, name
        assert families[name].type == kind, (name, families[name].type)
    samples = metric_samples(http)
    for name in ("vllm:num_requests_running", "vllm:generation_tokens_total", "vllm:num_preemptions_total"):
        assert samples[name][0].labels == {"model_name": MODEL, "engine": "0"}
    assert value(samples, "vllm:generation_tokens_total") >= 8
    assert value(samples, "vllm:request_success_total", finished_reason="length") >= 1
    assert {s.labels["finished_reason"] for s in samples["vllm:request_success_total"]} == {
        "stop",
        "length",
        "abort",
        "error",
    }
    bounds = [float(s.labels["le"]) for s in samples["vllm:time_to_first_token_seconds_bucket"]]
    assert bounds == [*TTFT_BUCKETS, math.inf]
    (info,) = samples["vllm:cache_config_info"]
    assert info.value == 1
    assert info.labels["block_size"] == "16"
    assert info.labels["num_gpu_blocks"] == str(QWEN36_35B_A3B_32GB.num_gpu_blocks)
    assert info.labels["gpu_memory_utilization"] == "0.9"
    assert info.labels["kv_cache_size_tokens"] == str(QWEN36_35B_A3B_32GB.kv_capacity_tokens)


def test_client_disconnect_aborts_the_sequence(http: httpx.Client, sim: RunningProcess) -> None:
    def aborted() -> float:
        return value(metric_samples(http), "vllm:request_success_total", finished_reason="abort")

    def running() -> int:
        return int(http.get("/admin/scenario").json()["num_running"])

    before = aborted()
    body = {"model": MODEL, "prompt": "go", "max_tokens": 4000, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=sim.url, timeout=60) as other, other.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few tokens in: the sequence is running
        assert any(line.startswith("data: {") for line in got)
        assert running() == 1
    wait_for(lambda: running() == 0)  # closing the stream freed the slot long before 4000 tokens
    wait_for(lambda: aborted() == before + 1)
    assert http.get("/admin/scenario").json()["kv_blocks_used"] == 0

    # a whole (non-stream) request whose client gives up is aborted too
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim.url}/v1/completions", json=body | {"stream": False}, timeout=0.5)
    wait_for(lambda: aborted() == before + 2)
    wait_for(lambda: running() == 0)


def test_admin_scenario_knobs(client: openai.OpenAI, http: httpx.Client) -> None:
    base = http.get("/admin/scenario").json()
    assert base["speed_factor"] == 1.0 and base["time_scale"] == 20.0
    view = http.post("/admin/scenario", json={"speed_factor": 2.0, "kv_fraction": 0.5, "max_num_seqs": 8}).json()
    assert view["speed_factor"] == 2.0 and view["max_num_seqs"] == 8
    assert view["kv_blocks_total"] == int(base["kv_blocks_total"] * 0.5)
    resp = client.completions.create(model=MODEL, prompt="x", max_tokens=3)  # still serving, slower
    assert resp.usage is not None and resp.usage.completion_tokens == 3

    http.post("/admin/scenario", json={"error_rate": 1.0})
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=3)

    http.post("/admin/scenario", json={"reset": True, "stall_s": 1.0})
    assert http.get("/admin/scenario").json()["stall_remaining_s"] > 0
    started = time.monotonic()
    resp = client.completions.create(model=MODEL, prompt="x", max_tokens=2)  # waits out the stall
    assert time.monotonic() - started >= 0.8
    assert resp.usage is not None and resp.usage.completion_tokens == 2

    bad = http.post("/admin/scenario", json={"speed": 3})
    assert bad.status_code == 400 and "unknown scenario knobs" in bad.json()["error"]["message"]
    assert http.post("/admin/scenario", json={"kv_fraction": 2}).status_code == 400
    assert http.post("/admin/scenario", json={"reset": True}).json()["kv_blocks_total"] == base["kv_blocks_total"]


def test_model_name_flag_and_admin_off_by_default() -> None:
    cmd = sweetspot("sim", "--port", "0", "--model-name", "my-model", "--profile", "llama3.1-8b-24gb")
    with start_process(cmd, ready_pattern=LISTENING, timeout=60) as proc:
        c = openai.OpenAI(base_url=f"{proc.url}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in c.models.list().data] == ["my-model"]
        assert httpx.get(f"{proc.url}/admin/scenario").status_code == 404
        assert httpx.post(f"{proc.url}/admin/scenario", json={}).status_code in (404, 405)
        info = [
            s
            for f in text_string_to_metric_families(httpx.get(f"{proc.url}/metrics").text)
            for s in f.samples
            if s.name == "vllm:cache_config_info"
        ]
        assert info[0].labels["num_gpu_blocks"] == "2473"
