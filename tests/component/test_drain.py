"""Rollouts cut nothing (``gateway.server.process.drain``): the drain the server runs on SIGTERM, run here on the
app in process. Readiness goes 503, new and queued requests get 503 with Retry-After, running streams run to their
end; at the deadline what still runs is interrupted, each request in its own way, and every permit comes back.
"""

from __future__ import annotations

import asyncio

from gateway.server.process.drain import drain
from tests.component.conftest import (
    BOUND_S,
    DONE,
    ROLE,
    Gate,
    Stage,
    body_then,
    hang,
    stream,
    token,
    until,
)


def assert_shutting_down(exchange) -> None:  # type: ignore[no-untyped-def]
    assert exchange.status == 503, exchange.body
    assert exchange.headers["retry-after"] == "1"
    assert exchange.error()["code"] == "shutting_down"


async def test_draining_refuses_new_and_queued_work_and_lets_running_streams_finish(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(stream(ROLE, token("a"), gate, token("b"), DONE))
    gw = await stage.gateway(upstream, initial_limit=1)
    running = gw.chat(stream=True)
    await running.wait_for(b'"a"')
    queued = gw.chat()
    await until(lambda: gw.parts.queue.depth == 1)
    ready = await gw.call("GET", "/readyz")
    assert ready.status == 200 and ready.json()["draining"] is False

    draining = asyncio.create_task(drain(gw.parts, timeout_s=BOUND_S))
    assert_shutting_down(await queued.done())
    new = await gw.chat().done()
    assert_shutting_down(new)
    assert new.headers["connection"] == "close"  # a retrying SDK reconnects, to another replica
    ready = await gw.call("GET", "/readyz")
    assert ready.status == 503 and ready.json()["ready"] is False and ready.json()["draining"] is True
    light = await gw.call("POST", "/tokenize", json_body={"model": "m", "prompt": "x"})
    assert_shutting_down(light)
    assert not draining.done()  # the stream still runs

    gate.open()
    await running.done()
    async with asyncio.timeout(BOUND_S):
        await draining
    assert running.body == ROLE + token("a") + token("b") + DONE  # nothing cut
    assert len(upstream.posts()) == 1  # neither refused request reached the upstream
    assert gw.metric("sweetspot_rejections_total", reason="shutting_down") == 3
    assert gw.metric("sweetspot_queue_wait_seconds_count", outcome="rejected", priority="standard") == 1
    gw.assert_settled()


async def test_with_nothing_running_the_drain_ends_at_once(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    async with asyncio.timeout(1):
        await drain(gw.parts, timeout_s=BOUND_S)
    assert gw.parts.drain.draining


async def test_at_the_deadline_each_running_request_is_interrupted_in_its_own_way(stage: Stage) -> None:
    streaming, waiting = await stage.upstream(models=["s"]), await stage.upstream(models=["w"])
    reading = await stage.upstream(models=["r"])
    streaming.then(stream(ROLE, token("a"), Gate(), DONE))  # a gate nobody opens
    waiting.then(hang())  # no answer yet
    reading.then(body_then(b'{"id": "half"}', sent=4, end="hang"))  # half an answer
    gw = await stage.gateway(streaming, waiting, reading)
    a_stream = gw.chat(stream=True, model="s")
    await a_stream.wait_for(b'"a"')
    no_answer, half_answer = gw.chat(model="w"), gw.chat(model="r")
    await waiting.received_count(1)
    await reading.received_count(1)
    await until(lambda: gw.inflight() == 3)

    async with asyncio.timeout(BOUND_S):
        await drain(gw.parts, timeout_s=0.05)

    for exchange in (a_stream, no_answer, half_answer):
        await exchange.done()
    assert a_stream.status == 200 and a_stream.body.startswith(ROLE + token("a"))
    last = a_stream.events()[-1]["error"]
    assert (last["code"], last["type"]) == ("shutting_down", "service_unavailable_error")
    assert_shutting_down(no_answer)
    assert_shutting_down(half_answer)
    for fake in (streaming, waiting, reading):
        await fake.wait(lambda fake=fake: fake.posts()[0].aborted)  # each generation cut upstream
        assert gw.outcomes(fake) == {"shut_down": 1}
    gw.assert_settled()


async def test_a_stream_whose_client_is_not_reading_still_gets_its_ending_at_the_deadline(stage: Stage) -> None:
    """The answer had not even begun (the client's connection was not taking bytes): it begins with the error."""
    upstream = await stage.upstream()
    upstream.then(stream(ROLE, token("a"), end="hang"))
    gw = await stage.gateway(upstream)
    exchange = gw.chat(stream=True)
    exchange.send_gate = Gate()
    await until(lambda: exchange.sends_waiting == 1)

    draining = asyncio.create_task(drain(gw.parts, timeout_s=0))
    await until(lambda: all(watch.reason is not None for watch in gw.parts.drain.running))  # interrupted
    exchange.send_gate.open()
    await exchange.done()
    async with asyncio.timeout(BOUND_S):
        await draining

    assert exchange.status == 200
    assert exchange.events()[-1]["error"]["code"] == "shutting_down"
    assert gw.outcomes(upstream) == {"shut_down": 1}
    gw.assert_settled()


async def test_a_queued_request_the_drain_refuses_never_reaches_the_upstream(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, initial_limit=1)
    running = gw.chat()
    await upstream.received_count(1)
    queued = [gw.chat() for _ in range(3)]
    await until(lambda: gw.parts.queue.depth == 3)
    draining = asyncio.create_task(drain(gw.parts, timeout_s=BOUND_S))
    for exchange in queued:
        assert_shutting_down(await exchange.done())
    gate.open()
    assert (await running.done()).status == 200
    async with asyncio.timeout(BOUND_S):
        await draining
    assert len(upstream.posts()) == 1
    gw.assert_settled()


async def test_a_queued_request_the_drain_refuses_is_told_to_reconnect_like_a_new_one(stage: Stage) -> None:
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(hang(gate))
    gw = await stage.gateway(upstream, initial_limit=1)
    running = gw.chat()
    await upstream.received_count(1)
    queued = gw.chat()
    await until(lambda: gw.parts.queue.depth == 1)
    draining = asyncio.create_task(drain(gw.parts, timeout_s=BOUND_S))
    await queued.done()
    new = await gw.chat().done()
    gate.open()
    await running.done()
    async with asyncio.timeout(BOUND_S):
        await draining
    assert new.headers["connection"] == "close"
    assert_shutting_down(queued)
    assert queued.headers.get("connection") == "close"
