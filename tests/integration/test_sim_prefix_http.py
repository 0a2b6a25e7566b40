"""``sweetspot sim`` over HTTP: a repeated chat prefix is a cache hit in vLLM's prefix-cache counters."""

from __future__ import annotations

import json
import urllib.request

from testbed.gateway import metric_value, start_sim

SYSTEM = "You answer in one word. " * 100  # 2,400 bytes: 600 tokens, 37 full blocks


def chat(url: str, messages: list[dict[str, str]]) -> dict:
    body = json.dumps({"model": None, "messages": messages, "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def counters(url: str) -> tuple[float | None, float | None]:
    return (
        metric_value(f"{url}/metrics", "vllm:prefix_cache_queries_total"),
        metric_value(f"{url}/metrics", "vllm:prefix_cache_hits_total"),
    )


def cache_info(url: str) -> str | None:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return sample.labels["enable_prefix_caching"]
    return None


def test_a_conversation_hits_the_prefix_cache_on_its_next_turn(processes) -> None:
    sim = start_sim(processes, time_scale=10)
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    prompt = chat(sim.url, first)["usage"]["prompt_tokens"]
    assert counters(sim.url) == (prompt, 0)
    second = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}]
    prompt2 = chat(sim.url, second)["usage"]["prompt_tokens"]
    queries, hits = counters(sim.url)
    assert queries == prompt + prompt2
    assert hits is not None and hits % 16 == 0 and (prompt - 16) <= hits < prompt  # the first prompt's full blocks
    assert cache_info(sim.url) == "True"


def test_prefix_caching_can_be_turned_off(processes) -> None:
    sim = start_sim(processes, "--no-prefix-caching", time_scale=10)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    chat(sim.url, messages)
    chat(sim.url, messages)
    assert counters(sim.url) == (0, 0)
    assert cache_info(sim.url) == "False"
