"""The KV cap before any request has finished, on the request path: a gateway in front of a vLLM that publishes
its KV cache's size holds long prompts back at the cap their estimated size gives, before forwarding any
(``gateway.control.knee_search.kv_estimate``); in front of llama-server, which publishes none, nothing changes."""

from __future__ import annotations

from tests.component.conftest import MODEL, Gate, Stage, hang, until

# vLLM's page as the RAG deployment's Mistral-7B on a 24 GB card shows it: 6,749 blocks of 16 tokens.
VLLM_RAG = (
    "vllm:num_requests_running 0\n"
    "vllm:num_requests_waiting 0\n"
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="6749"} 1.0\n'
)
# About 28K tokens of English-like text (5 characters, a word and a space, to 1.25 tokens).
RAG_PROMPT = [{"role": "user", "content": "word " * 22_400}]


async def test_long_prompts_wait_at_the_gateway_for_the_cap_their_size_gives(stage: Stage) -> None:
    fake = await stage.upstream()
    fake.metrics_text = VLLM_RAG
    gate = Gate()
    fake.default = hang(gate)
    gw = await stage.gateway(fake, control_enabled=True, control_interval_s=3600, initial_limit=8)
    upstream = gw.upstream(fake)
    await until(lambda: upstream.kv_size is not None)
    assert upstream.kv_size == (6749 * 16, 16) and upstream.limiter.limit == 8
    body = {"model": MODEL, "messages": RAG_PROMPT, "max_tokens": 320}
    exchanges = [gw.request("POST", "/v1/chat/completions", json_body=body) for _ in range(5)]
    await fake.received_count(3)
    await until(lambda: gw.parts.queue.depth == 2)
    # Three fit in the cache: the limit came down before the fourth was admitted, with no control tick.
    assert upstream.limiter.limit == 3 and len(fake.posts()) == 3
    gate.open()
    for exchange in exchanges:
        assert (await exchange.done()).status == 200
    assert len(fake.posts()) == 5
    gw.assert_settled()


async def test_without_a_published_kv_size_long_prompts_go_at_the_starting_limit(stage: Stage) -> None:
    fake = await stage.upstream()
    fake.props = {"total_slots": 16}  # llama-server: slots, and no KV cache size on any page
    gate = Gate()
    fake.default = hang(gate)
    gw = await stage.gateway(fake, control_enabled=True, control_interval_s=3600, initial_limit=8)
    upstream = gw.upstream(fake)
    body = {"model": MODEL, "messages": RAG_PROMPT, "max_tokens": 320}
    exchanges = [gw.request("POST", "/v1/chat/completions", json_body=body) for _ in range(5)]
    await fake.received_count(5)
    assert upstream.kv_size is None and upstream.limiter.limit == 8 and gw.parts.queue.depth == 0
    gate.open()
    for exchange in exchanges:
        assert (await exchange.done()).status == 200
    gw.assert_settled()
