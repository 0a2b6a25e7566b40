"""The queue in front of the upstreams, through the app: overload answers (429 or 503, always with Retry-After, in
OpenAI's shape), tenants' own bounds, and a client that leaves while it waits.

The upstream holds each admitted request at a gate, so the queue's state at each step is set by the test, not by
timing: a request is known to be queued when the gateway's queue depth says so.
"""

from __future__ import annotations

import pytest

from gateway.settings import TenantConfig
from tests.component.conftest import (
    MODEL,
    Gate,
    Stage,
    chat_answer,
    hang,
    until,
    whole,
)


async def test_a_full_queue_answers_429_with_retry_after_and_the_queue_drains_after(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, initial_limit=1, max_queue=1)
    running = gw.chat()
    await upstream.received_count(1)
    queued = gw.chat()
    await until(lambda: gw.parts.queue.depth == 1)

    refused = await gw.chat().done()

    assert refused.status == 429
    error = refused.error()
    assert (error["type"], error["code"]) == ("rate_limit_error", "queue_full")
    assert refused.headers["x-sweetspot-reason"] == "queue_full"
    assert refused.headers["retry-after"] == "5"  # nothing released yet: no rate to go by
    assert "x-sweetspot-queue-seconds" not in refused.headers  # it never held a place
    gate.open()
    assert (await running.done()).status == 200 and (await queued.done()).status == 200
    assert len(upstream.posts()) == 2
    assert gw.metric("sweetspot_rejections_total", reason="queue_full") == 1
    assert gw.metric("sweetspot_queue_wait_seconds_count", outcome="rejected", priority="standard") == 1
    assert gw.metric("sweetspot_queue_wait_seconds_count", outcome="admitted", priority="standard") == 2
    gw.assert_settled()


async def test_no_queue_at_all_refuses_what_finds_no_free_permit(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, initial_limit=1, max_queue=0)
    running = gw.chat()
    await upstream.received_count(1)
    assert (await gw.chat().done()).status == 429
    gate.open()
    await running.done()
    # with the permit back, the next one goes straight through
    assert (await gw.chat().done()).status == 200


async def test_queued_too_long_answers_503_with_retry_after(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, initial_limit=1, queue_timeout_s=0.05)
    running = gw.chat()
    await upstream.received_count(1)
    waited = await gw.chat().done()
    assert waited.status == 503
    error = waited.error()
    assert (error["type"], error["code"]) == ("service_unavailable_error", "queue_timeout")
    assert int(waited.headers["retry-after"]) >= 1
    assert gw.metric("sweetspot_queue_wait_seconds_count", outcome="timed_out", priority="standard") == 1
    gate.open()
    await running.done()
    assert len(upstream.posts()) == 1  # the one that timed out never went upstream
    gw.assert_settled()


async def test_retry_after_follows_how_fast_the_queue_moves(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, initial_limit=1, max_queue=1)
    for _ in range(3):
        assert (await gw.chat().done()).status == 200  # three releases just now: a rate to go by
    gate = Gate()
    upstream.then(hang(gate))
    running = gw.chat()
    await upstream.received_count(4)
    queued = gw.chat()
    await until(lambda: gw.parts.queue.depth == 1)
    refused = await gw.chat().done()
    assert refused.status == 429 and int(refused.headers["retry-after"]) <= 2  # 3 releases just now, 1 ahead
    gate.open()
    await running.done()
    await queued.done()


async def test_an_upstream_reported_down_answers_503_with_retry_after_and_never_queues(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.health = 503  # "Loading model"
    gw = await stage.gateway(upstream)
    exchange = await gw.chat().done()
    assert exchange.status == 503 and exchange.headers["retry-after"] == "2"
    assert exchange.error()["code"] == "no_upstream"
    assert upstream.posts() == []
    assert gw.metric("sweetspot_rejections_total", reason="no_upstream") == 1


async def test_a_client_that_leaves_while_queued_never_reaches_the_upstream(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, initial_limit=1)
    running = gw.chat()
    await upstream.received_count(1)
    leaving = gw.chat()
    await until(lambda: gw.parts.queue.depth == 1)

    leaving.hang_up()
    await leaving.done()

    assert gw.parts.queue.depth == 0
    assert gw.metric("sweetspot_rejections_total", reason="client_disconnected") == 1
    assert gw.metric("sweetspot_queue_wait_seconds_count", outcome="client_gone", priority="standard") == 1
    assert gw.metric("sweetspot_requests_total", route="/v1/chat/completions", status="499", model=MODEL) == 1
    gate.open()
    await running.done()
    assert len(upstream.posts()) == 1  # the permit it would have had was never used
    gw.assert_settled()


async def test_the_queue_admits_the_higher_class_first(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, initial_limit=1)
    running = gw.chat()
    await upstream.received_count(1)
    batch = gw.chat(headers={"x-sweetspot-priority": "batch"}, user="batch")
    await until(lambda: gw.parts.queue.depth == 1)
    standard = gw.chat(user="standard")  # the default tenant's own class; it may not ask above it
    await until(lambda: gw.parts.queue.depth == 2)
    gate.open()
    for exchange in (running, batch, standard):
        assert (await exchange.done()).status == 200
    assert [seen.json.get("user") for seen in upstream.posts()] == [None, "standard", "batch"]
    gw.assert_settled()


# --- tenants ---------------------------------------------------------------------------------------------

TENANTS = [
    TenantConfig(name="alpha", api_keys=["key-alpha"], max_queued=1, priority="interactive"),
    TenantConfig(name="beta", api_keys=["key-beta"], output_tokens_per_minute=60),
    TenantConfig(name="gamma", api_keys=["key-gamma"], max_inflight=1),
]


def as_tenant(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer key-{name}"}


async def test_a_tenant_over_its_queue_cap_gets_its_own_429_and_others_are_untouched(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, initial_limit=1, tenants=TENANTS)
    running = gw.chat(headers=as_tenant("gamma"))
    await upstream.received_count(1)
    queued = gw.chat(headers=as_tenant("alpha"))
    await until(lambda: gw.parts.queue.depth == 1)

    over = await gw.chat(headers=as_tenant("alpha")).done()

    assert over.status == 429 and over.error()["code"] == "tenant_queue_full"
    assert int(over.headers["retry-after"]) >= 1
    other = gw.chat(headers=as_tenant("beta"))  # queues behind: its own cap is not alpha's
    await until(lambda: gw.parts.queue.depth == 2)
    gate.open()
    for exchange in (running, queued, other):
        assert (await exchange.done()).status == 200
    assert gw.metric("sweetspot_rejections_total", reason="tenant_queue_full") == 1
    gw.assert_settled()


async def test_a_tenant_past_its_quota_gets_429_until_it_refills(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(whole(chat_answer(completion=90)))  # 90 tokens of a 60 per minute quota: 30 s of debt
    gw = await stage.gateway(upstream, tenants=TENANTS)
    assert (await gw.chat(headers=as_tenant("beta")).done()).status == 200
    over = await gw.chat(headers=as_tenant("beta")).done()
    assert over.status == 429 and over.error()["code"] == "quota_exceeded"
    assert 28 <= int(over.headers["retry-after"]) <= 31  # less the refill since
    assert (await gw.chat(headers=as_tenant("alpha")).done()).status == 200  # another tenant is not held back
    assert len(upstream.posts()) == 2


async def test_a_tenant_at_its_in_flight_cap_waits_while_others_run(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, tenants=TENANTS)  # a limit of 4: room for more than gamma's one
    first = gw.chat(headers=as_tenant("gamma"))
    await upstream.received_count(1)
    second = gw.chat(headers=as_tenant("gamma"))
    await until(lambda: gw.parts.queue.depth == 1)
    assert (await gw.chat(headers=as_tenant("beta")).done()).status == 200  # past gamma's waiting request
    gate.open()
    assert (await first.done()).status == 200 and (await second.done()).status == 200
    gw.assert_settled()


async def test_tenants_are_counted_apart(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, tenants=TENANTS)
    await gw.chat(headers=as_tenant("alpha")).done()
    await gw.chat(headers=as_tenant("alpha")).done()
    await gw.chat(headers=as_tenant("beta")).done()
    assert gw.metric("sweetspot_tenant_requests_total", tenant="alpha") == 2
    assert gw.metric("sweetspot_tenant_requests_total", tenant="beta") == 1
    assert gw.metric("sweetspot_tenant_output_tokens_total", tenant="beta") == 1


@pytest.mark.parametrize("header", ["x-tenant"])
async def test_on_a_trusted_network_a_header_names_the_tenant(stage: Stage, header: str) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, tenant_header=header, tenants=[TenantConfig(name="known", weight=2)])
    await gw.chat(headers={header: "known"}).done()
    await gw.chat(headers={header: "someone-else"}).done()
    await gw.chat(headers={header: "bad name!"}).done()  # not a name: the default tenant's
    assert gw.metric("sweetspot_tenant_requests_total", tenant="known") == 1
    assert gw.metric("sweetspot_tenant_requests_total", tenant="other") == 1
    assert gw.metric("sweetspot_tenant_requests_total", tenant="default") == 1
