"""Two tenants, two keys, through the real OpenAI SDK: the gateway under uvicorn in front of the simulator.

What each tenant's client observes: its own 429s (queue cap, quota) with Retry-After, the other tenant
untouched, and the operator's per-tenant metrics and /state.
"""

from __future__ import annotations

import openai
import pytest

from testbed.gateway import get_json, metric_value, start_gateway, start_sim

CHAT = [{"role": "user", "content": "Tell me about fair queuing."}]
CONFIG = """
upstreams = []
[[tenants]]
name = "alpha"
api_keys = ["key-alpha"]
max_queued = 1
[[tenants]]
name = "beta"
api_keys = ["key-beta"]
weight = 2
output_tokens_per_minute = 30
[[tenants]]
name = "gamma"
api_keys = ["key-gamma"]
weight = 2
"""


@pytest.fixture(scope="module")
def sim(module_processes):
    return start_sim(module_processes, "--seed", "3", time_scale=1.0).url


@pytest.fixture(scope="module")
def gateway(module_processes, sim, tmp_path_factory):
    config = tmp_path_factory.mktemp("tenants") / "sweetspot.toml"
    config.write_text(CONFIG.replace("upstreams = []", f'upstreams = ["{sim}"]'))
    # Four slots, the top one reserved (tenant_reserve 0.1: one slot) for a tenant well under its share.
    return start_gateway(module_processes, [], "--config", str(config), "--initial-limit", "4", "--no-control").url


def client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)


def model_of(base: str) -> str:
    return client(base, "key-alpha").models.list().data[0].id


def test_an_unknown_key_is_refused(gateway) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "key-nobody").chat.completions.create(model=model_of(gateway), messages=CHAT, max_tokens=2)


def long_stream(base: str, key: str, model: str) -> openai.Stream:
    stream = client(base, key).chat.completions.create(
        model=model, messages=CHAT, max_tokens=3000, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    return stream


def test_a_tenant_over_its_queue_cap_gets_its_own_429(gateway) -> None:
    import threading

    model = model_of(gateway)
    alpha = client(gateway, "key-alpha")
    # gamma runs one long stream, alpha two: three of the four slots; the fourth is kept for gamma, which holds
    # less than half its share (4 x 2/3).
    holds = [long_stream(gateway, "key-gamma", model)] + [long_stream(gateway, "key-alpha", model) for _ in range(2)]
    queued_done: list[object] = []
    queued = threading.Thread(
        target=lambda: queued_done.append(alpha.chat.completions.create(model=model, messages=CHAT, max_tokens=2))
    )
    queued.start()
    try:
        _wait_for_queue(gateway, "alpha", 1)
        with pytest.raises(openai.RateLimitError) as refused:
            alpha.chat.completions.create(model=model, messages=CHAT, max_tokens=2)
        response = refused.value.response
        assert response.headers["x-sweetspot-reason"] == "tenant_queue_full"
        assert 1 <= int(response.headers["retry-after"]) <= 60
        assert refused.value.body["code"] == "tenant_queue_full"  # type: ignore[index]
        # gamma is not alpha: under its share, it runs at once in the reserved slot, within the limit, while
        # alpha's next request still waits.
        gamma = client(gateway, "key-gamma").chat.completions.create(model=model, messages=CHAT, max_tokens=2)
        assert gamma.choices and not queued_done
        upstream = get_json(f"{gateway}/state")["upstreams"][0]
        assert upstream["limit"] == 4 and upstream["inflight"] <= 4
    finally:
        for hold in holds:
            hold.close()
    queued.join(60)
    assert queued_done
    rejected = metric_value(
        f"{gateway}/metrics", "sweetspot_tenant_rejections_total", {"tenant": "alpha", "reason": "tenant_queue_full"}
    )
    assert rejected == 1
    assert (
        metric_value(
            f"{gateway}/metrics",
            "sweetspot_tenant_rejections_total",
            {"tenant": "gamma", "reason": "tenant_queue_full"},
        )
        is None
    )


def test_a_tenant_over_its_quota_gets_429_until_it_refills(gateway) -> None:
    model = model_of(gateway)
    beta = client(gateway, "key-beta")
    reply = beta.chat.completions.create(model=model, messages=CHAT, max_tokens=40, extra_body={"ignore_eos": True})
    assert reply.usage is not None and reply.usage.completion_tokens == 40  # 10 over its 30 a minute
    with pytest.raises(openai.RateLimitError) as refused:
        beta.chat.completions.create(model=model, messages=CHAT, max_tokens=2)
    response = refused.value.response
    assert response.headers["x-sweetspot-reason"] == "quota_exceeded"
    assert 15 <= int(response.headers["retry-after"]) <= 30  # 10-14 tokens owed at half a token a second
    # alpha has no quota: untouched.
    assert client(gateway, "key-alpha").chat.completions.create(model=model, messages=CHAT, max_tokens=2).choices
    state = get_json(f"{gateway}/state")["tenants"]
    assert state["beta"]["quota"]["left"] < 0 and state["beta"]["weight"] == 2
    assert state["alpha"]["quota"] is None
    tokens = metric_value(f"{gateway}/metrics", "sweetspot_tenant_output_tokens_total", {"tenant": "beta"})
    assert tokens is not None and tokens >= 40
    assert (
        metric_value(
            f"{gateway}/metrics", "sweetspot_tenant_rejections_total", {"tenant": "beta", "reason": "quota_exceeded"}
        )
        == 1
    )
    requests = metric_value(f"{gateway}/metrics", "sweetspot_tenant_requests_total", {"tenant": "alpha"})
    assert requests is not None and requests >= 4
    waits = metric_value(f"{gateway}/metrics", "sweetspot_tenant_queue_wait_seconds_count", {"tenant": "beta"})
    assert waits is not None and waits >= 1


def _wait_for_queue(gateway: str, tenant: str, depth: int) -> None:
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if metric_value(f"{gateway}/metrics", "sweetspot_tenant_queue_depth", {"tenant": tenant}) == depth:
            return
        time.sleep(0.05)
    raise AssertionError(f"{tenant} never had {depth} queued: {get_json(f'{gateway}/state')['tenants']}")
