"""At most once (``gateway.server.upstream.upstream_client`` and the failover in ``routes/forward.py``): a request
is sent again only when the upstream provably never ran it, and every wait on an upstream has a bound.

What each test counts is what the fake upstreams *read*: a resend or a failover shows as a second delivery, a
duplicated generation would too.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from gateway.common.resend import STALE_WITHIN_S
from gateway.server.upstream.health import health_tick
from tests.component.conftest import (
    DONE,
    MODEL,
    ROLE,
    FakeUpstream,
    Gate,
    Stage,
    body_then,
    chat_answer,
    drop,
    hang,
    refuse,
    refused_url,
    stream,
    token,
    until,
    whole,
)


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_request_read_and_dropped_is_a_502_and_is_never_sent_again(stage: Stage, streamed: bool) -> None:
    """A fresh connection closed after the request went out: the upstream may be generating. No failover."""
    first, second = await stage.upstream(), await stage.upstream()
    first.then(drop())
    gw = await stage.gateway(first, second)
    exchange = await gw.chat(stream=streamed).done()
    assert exchange.status == 502
    error = exchange.error()
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_unavailable")
    assert "upstream-1" in error["message"] and first.url not in error["message"]  # its name, never its URL
    assert len(first.posts()) == 1 and second.posts() == []
    assert gw.outcomes(first) == {"upstream_error": 1}
    assert gw.upstream(first).healthy  # it answered the connection: not taken out
    gw.assert_settled()


async def test_a_kept_connection_closed_under_the_next_request_is_resent_and_read_once(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    assert (await gw.chat().done()).status == 200  # leaves a kept connection in the pool
    upstream.close_kept = True
    for done in range(2, 5):
        exchange = await gw.chat().done()
        assert exchange.status == 200
        assert len(upstream.posts()) == done  # each read exactly once
    assert upstream.unread == 3  # each went out first on the kept connection the server had closed
    assert gw.metric("sweetspot_upstream_retries_total", upstream=upstream.url, reason="stale_connection") == 3
    assert gw.outcomes(upstream) == {"ok": 4}
    gw.assert_settled()


async def test_when_every_kept_connection_is_found_closed_the_request_fails_over(stage: Stage) -> None:
    """Three kept connections, each closed under the request (two resends): provably not run, so it goes to the
    other upstream; with nowhere else to go it would be a 502."""
    first, second = await stage.upstream(models=[MODEL, "first-only"]), await stage.upstream()
    gates = [Gate() for _ in range(3)]
    first.then(*(hang(gate) for gate in gates))
    gw = await stage.gateway(first, second)
    # three requests at once that only the first upstream serves: three connections, pooled when they end
    running = []
    for count in range(1, 4):
        running.append(gw.chat(model="first-only"))
        await first.received_count(count)
    for gate in gates:
        gate.open()
    for exchange in running:
        assert (await exchange.done()).status == 200
    first.close_kept = True

    exchange = await gw.chat().done()

    assert exchange.status == 200
    assert first.unread == 3 and len(first.posts()) == 3 and len(second.posts()) == 1
    assert gw.metric("sweetspot_upstream_retries_total", upstream=first.url, reason="stale_connection") == 2
    assert gw.metric("sweetspot_upstream_retries_total", upstream=first.url, reason="failover") == 1
    gw.assert_settled()


async def test_when_every_kept_connection_is_found_closed_and_there_is_no_other_upstream_it_is_a_502(
    stage: Stage,
) -> None:
    upstream = await stage.upstream()
    gates = [Gate() for _ in range(3)]
    upstream.then(*(hang(gate) for gate in gates))
    gw = await stage.gateway(upstream)
    running = []
    for count in range(1, 4):
        running.append(gw.chat())
        await upstream.received_count(count)
    for gate in gates:
        gate.open()
    for exchange in running:
        await exchange.done()
    upstream.close_kept = True
    exchange = await gw.chat().done()
    assert exchange.status == 502
    assert "closed every kept connection" in exchange.error()["message"]
    assert upstream.unread == 3 and len(upstream.posts()) == 3
    gw.assert_settled()


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_kept_connection_that_dies_after_holding_the_request_is_a_502_and_never_resent(
    stage: Stage, streamed: bool
) -> None:
    """The keep-alive race fails a request at once; a server that read it, held it and died (an OOM kill, a
    rollout) fails it the same way later, when it may have been running: read once, a 502."""
    first, second = await stage.upstream(), await stage.upstream()
    # vLLM's metrics: its streams keep their connections too, so a stream also goes out on a kept one
    first.metrics_text = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    gw = await stage.gateway(first, second)
    await until(lambda: gw.upstream(first).streams_keep_alive)  # the start-up scrape recognised it
    assert (await gw.chat().done()).status == 200  # a kept connection to the first upstream
    gate = Gate()
    first.then(hang(gate, then=drop()))
    exchange = gw.chat(stream=streamed)
    await first.received_count(2)
    await asyncio.sleep(STALE_WITHIN_S + 0.05)  # held past the race's window
    gate.open()
    await exchange.done()
    assert exchange.status == 502 and exchange.error()["code"] == "upstream_unavailable"
    assert len(first.posts()) == 2 and second.posts() == []
    assert gw.metric("sweetspot_upstream_retries_total", upstream=first.url, reason="stale_connection") == 0
    gw.assert_settled()


async def test_a_resend_that_finds_nothing_listening_is_not_failed_over(stage: Stage) -> None:
    """The kept connection failed at once (resent), and then nothing listens: a crash under the request, which
    may have run. It goes nowhere else."""
    first, second = await stage.upstream(), await stage.upstream()
    gw = await stage.gateway(first, second)
    assert (await gw.chat().done()).status == 200
    first.close_kept = True
    await first.stop_listening()
    exchange = await gw.chat().done()
    assert exchange.status == 502 and "cannot connect" in exchange.error()["message"]
    assert first.unread == 1 and len(first.posts()) == 1 and second.posts() == []
    assert not gw.upstream(first).healthy
    gw.assert_settled()


async def test_a_refused_connection_fails_over_and_takes_the_upstream_out(stage: Stage) -> None:
    doomed, alive = await stage.upstream(), await stage.upstream()
    gw = await stage.gateway(doomed, alive)
    await doomed.close()  # nothing listens there any more

    exchange = await gw.chat().done()

    assert exchange.status == 200 and len(alive.posts()) == 1
    assert gw.metric("sweetspot_upstream_retries_total", upstream=doomed.url, reason="failover") == 1
    state = gw.upstream(doomed)
    assert not state.healthy and "cannot connect" in (state.health_error or "")
    assert gw.outcomes(doomed) == {"upstream_error": 1} and gw.outcomes(alive) == {"ok": 1}
    # taken out: the next request goes straight to the other one
    assert (await gw.chat().done()).status == 200
    assert len(alive.posts()) == 2
    assert gw.metric("sweetspot_upstream_retries_total", upstream=doomed.url, reason="failover") == 1
    gw.assert_settled()


async def test_a_refused_connection_with_nowhere_else_to_go_is_a_502_then_503_until_it_is_back(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream)
    await upstream.close()
    first = await gw.chat().done()
    assert first.status == 502 and first.error()["code"] == "upstream_unavailable"
    second = await gw.chat().done()
    assert second.status == 503 and second.headers["retry-after"] == "2"
    assert second.error()["code"] == "no_upstream"
    gw.assert_settled()


async def test_nothing_listening_from_the_start_means_503_with_retry_after(stage: Stage) -> None:
    url, sock = refused_url()
    try:
        gw = await stage.gateway(url)
        exchange = await gw.chat().done()
        assert exchange.status == 503 and exchange.headers["retry-after"] == "2"
        assert exchange.error()["type"] == "service_unavailable_error"
        gw.assert_settled()
    finally:
        sock.close()


@pytest.mark.parametrize("refusal", [503, 429])
async def test_an_explicit_refusal_fails_over_at_most_once(stage: Stage, refusal: int) -> None:
    """503 or 429 means "not run": one other upstream is tried, never a third."""
    fakes = [await stage.upstream() for _ in range(3)]
    for fake in fakes:
        fake.default = refuse(refusal, retry_after="7")
    gw = await stage.gateway(*fakes)
    exchange = await gw.chat().done()
    assert exchange.status == refusal and exchange.headers["retry-after"] == "7"
    assert exchange.json()["error"]["message"] == f"fake upstream answers {refusal}"  # the upstream's own body
    assert sum(len(fake.posts()) for fake in fakes) == 2
    assert all(gw.upstream(fake).healthy for fake in fakes)  # answering is not being down
    gw.assert_settled()


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_refusal_fails_over_to_an_upstream_that_answers(stage: Stage, streamed: bool) -> None:
    refusing, alive = await stage.upstream(), await stage.upstream()
    refusing.default = refuse(503)
    if streamed:
        alive.then(stream(ROLE, token("a"), DONE))
    gw = await stage.gateway(refusing, alive)
    exchange = await gw.chat(stream=streamed).done()
    assert exchange.status == 200
    assert exchange.body == ROLE + token("a") + DONE if streamed else exchange.json() == chat_answer()
    assert len(refusing.posts()) == 1 and len(alive.posts()) == 1
    assert gw.outcomes(refusing) == {"upstream_error": 1} and gw.outcomes(alive) == {"ok": 1}
    assert gw.metric("sweetspot_upstream_retries_total", upstream=refusing.url, reason="failover") == 1
    assert gw.upstream(refusing).window.stats(gw.parts.clock()).upstream_errors == 1  # its congestion signal
    gw.assert_settled()


async def test_a_refusal_is_not_failed_over_when_the_other_upstream_is_full(stage: Stage) -> None:
    """Failover takes a free permit now or not at all: it never queues behind the others."""
    refusing, busy = await stage.upstream(), await stage.upstream(models=[MODEL, "busy-only"])
    refusing.default = refuse(503)
    gate = Gate()
    busy.then(hang(gate))
    gw = await stage.gateway(refusing, busy, initial_limit=1)
    holder = gw.chat(model="busy-only")
    await busy.received_count(1)
    exchange = await gw.chat().done()
    assert exchange.status == 503 and exchange.headers["retry-after"] == "1"  # none from the upstream: ours
    assert exchange.json()["error"]["message"] == "fake upstream answers 503"
    assert len(refusing.posts()) == 1 and len(busy.posts()) == 1
    gate.open()
    await holder.done()
    gw.assert_settled()


@pytest.mark.parametrize("refusal", [503, 429])
async def test_a_refusal_that_is_not_the_engines_own_error_is_never_sent_elsewhere(stage: Stage, refusal: int):
    """A proxy's page in front of the engine (not its JSON error) says nothing of whether the engine ran it."""
    proxied, other = await stage.upstream(), await stage.upstream()
    proxied.then(refuse(refusal, shaped=False))
    gw = await stage.gateway(proxied, other)
    exchange = await gw.chat().done()
    assert exchange.status == refusal and exchange.headers["retry-after"] == "1"
    error = exchange.error()
    assert error["code"] == "upstream_unavailable" and f"answered {refusal}" in error["message"]
    assert len(proxied.posts()) == 1 and other.posts() == []
    gw.assert_settled()


@pytest.mark.parametrize("status", [500, 502])
async def test_an_upstreams_5xx_is_never_sent_anywhere_else_and_its_shaped_body_reaches_the_client(
    stage: Stage, status: int
) -> None:
    failing, other = await stage.upstream(), await stage.upstream()
    failing.then(refuse(status))
    gw = await stage.gateway(failing, other)
    exchange = await gw.chat().done()
    assert exchange.status == status
    assert exchange.json() == {
        "error": {"message": f"fake upstream answers {status}", "type": "server_error", "param": None, "code": status}
    }
    assert "retry-after" not in exchange.headers
    assert len(failing.posts()) == 1 and other.posts() == []
    gw.assert_settled()


async def test_an_unshaped_5xx_becomes_the_gateways_502(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(refuse(500, shaped=False))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat().done()
    assert exchange.status == 502
    error = exchange.error()
    assert error["code"] == "upstream_unavailable" and "answered 500" in error["message"]


async def test_a_refusal_whose_body_breaks_off_is_still_a_refusal(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(body_then(b'{"error": {"message": "loading"}}', sent=5, end="die", status=503))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat().done()
    assert exchange.status == 503 and exchange.headers["retry-after"] == "1"
    assert exchange.error()["code"] == "upstream_unavailable"
    gw.assert_settled()


async def test_an_upstream_that_never_answers_is_a_504_its_permit_returns_and_in_a_row_it_is_taken_out(
    stage: Stage,
) -> None:
    upstream = await stage.upstream()
    upstream.default = hang()
    gw = await stage.gateway(
        upstream, upstream_timeout_s=0.05, first_token_timeout_s=0.05, upstream_timeouts_to_down=2, health_hold_s=60
    )
    for streamed in (False, True):
        exchange = await gw.chat(stream=streamed).done()
        assert exchange.status == 504
        error = exchange.error()
        assert (error["type"], error["code"]) == ("timeout_error", "upstream_timeout")
        assert upstream.url not in error["message"]
    await upstream.wait(lambda: all(seen.aborted for seen in upstream.posts()))  # the upstream request was cut
    assert gw.outcomes(upstream) == {"timed_out": 2}
    state = gw.upstream(upstream)
    assert not state.healthy and "2 requests in a row timed out" in (state.health_error or "")
    exchange = await gw.chat().done()
    assert exchange.status == 503 and exchange.error()["code"] == "no_upstream"
    assert exchange.headers["retry-after"] == "2" and exchange.headers["x-sweetspot-reason"] == "no_upstream"
    gw.assert_settled()


async def test_a_timeout_between_successes_does_not_take_the_upstream_out(stage: Stage) -> None:
    upstream = await stage.upstream()
    gw = await stage.gateway(upstream, upstream_timeout_s=0.3, upstream_timeouts_to_down=2)
    upstream.then(hang(), whole(chat_answer()), hang())
    statuses = [(await gw.chat().done()).status for _ in range(3)]
    assert statuses == [504, 200, 504]
    assert gw.upstream(upstream).healthy


async def test_a_whole_answer_that_breaks_off_is_a_502(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(body_then(b'{"id": "x", "choices": []}', sent=8, end="die"))
    gw = await stage.gateway(upstream)
    exchange = await gw.chat().done()
    assert exchange.status == 502
    error = exchange.error()
    assert error["code"] == "upstream_disconnected" and "ClientPayloadError" in error["message"]
    assert gw.outcomes(upstream) == {"upstream_error": 1}
    gw.assert_settled()


async def test_a_whole_answer_that_stops_coming_is_a_504_within_the_upstream_timeout(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(body_then(b'{"id": "x", "choices": []}', sent=8, end="hang"))
    gw = await stage.gateway(upstream, upstream_timeout_s=0.1)
    exchange = await gw.chat().done()
    assert exchange.status == 504 and exchange.error()["code"] == "upstream_timeout"
    await upstream.wait(lambda: upstream.posts()[0].aborted)
    assert gw.outcomes(upstream) == {"timed_out": 1}
    gw.assert_settled()


async def test_a_client_that_leaves_while_a_whole_answer_is_read_aborts_it_upstream(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(body_then(b'{"id": "x", "choices": []}', sent=8, end="hang"))
    gw = await stage.gateway(upstream)
    exchange = gw.chat()
    await upstream.received_count(1)
    await until(lambda: gw.inflight() == 1)
    exchange.hang_up()
    await exchange.done()
    await upstream.wait(lambda: upstream.posts()[0].aborted)
    assert gw.outcomes(upstream) == {"client_cancelled": 1}
    assert gw.metric("sweetspot_requests_total", route="/v1/chat/completions", status="499", model="m") == 1
    gw.assert_settled()


async def test_a_client_that_leaves_before_the_upstream_answers_aborts_it_there(stage: Stage) -> None:
    upstream = await stage.upstream()
    upstream.then(hang())
    gw = await stage.gateway(upstream)
    exchange = gw.chat()
    (seen,) = await upstream.received_count(1)
    exchange.hang_up()
    await exchange.done()
    await upstream.wait(lambda: seen.aborted)
    assert gw.outcomes(upstream) == {"client_cancelled": 1}
    assert gw.upstream(upstream).healthy
    gw.assert_settled()


async def test_a_slow_answer_within_its_bounds_is_not_cut(stage: Stage) -> None:
    """The bounds are bounds, not targets: an answer that waits on a gate and then comes is passed on."""
    upstream = await stage.upstream()
    gate = Gate()
    upstream.then(body_then(b'{"id": "slow"}', sent=3, end="hang", gate=gate))
    gw = await stage.gateway(upstream)
    exchange = gw.chat()
    await upstream.received_count(1)
    gate.open()
    await exchange.done()
    assert exchange.status == 200 and exchange.json() == {"id": "slow"}


async def test_failover_when_nothing_listens_keeps_each_request_read_once(stage: Stage) -> None:
    doomed: FakeUpstream = await stage.upstream()
    alive = await stage.upstream()
    gw = await stage.gateway(doomed, alive)
    await doomed.close()
    results = await asyncio.gather(*(gw.chat().done() for _ in range(4)))
    assert [r.status for r in results] == [200] * 4
    assert len(alive.posts()) == 4 and doomed.posts() == []
    gw.assert_settled()


def unanswered_listener(port: int) -> list[socket.socket]:
    """A listener on ``port`` that never accepts, its backlog full: a new connection's SYN is dropped, so a connect
    neither succeeds nor is refused (a host that stopped answering). Returns the sockets to close."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(0)
    held = [listener]
    for _ in range(8):  # fill the accept queue until a connect gets no answer
        filler = socket.socket()
        filler.settimeout(0.2)
        held.append(filler)
        try:
            filler.connect(("127.0.0.1", port))
        except TimeoutError:
            return held
    raise AssertionError("the backlog never filled")


async def test_a_connect_that_gets_no_answer_fails_over_within_the_connect_timeout(stage: Stage) -> None:
    silent, alive = await stage.upstream(), await stage.upstream()
    gw = await stage.gateway(silent, alive, connect_timeout_s=0.3)
    await silent.close()
    held = unanswered_listener(int(silent.url.rsplit(":", 1)[1]))
    try:
        exchange = await gw.chat().done()
    finally:
        for sock in held:
            sock.close()
    assert exchange.status == 200 and len(alive.posts()) == 1
    state = gw.upstream(silent)
    assert not state.healthy and "within 0.3 s" in (state.health_error or "")
    gw.assert_settled()


@pytest.mark.parametrize(("hold_s", "back"), [(60.0, False), (0.0, True)])
async def test_an_upstream_taken_out_for_timeouts_comes_back_only_after_its_hold(
    stage: Stage, hold_s: float, back: bool
) -> None:
    """Its /health still answers: the poll alone must not bring it back before the hold is over."""
    upstream = await stage.upstream()
    upstream.default = hang()
    gw = await stage.gateway(upstream, upstream_timeout_s=0.3, upstream_timeouts_to_down=1, health_hold_s=hold_s)
    assert (await gw.chat().done()).status == 504
    assert not gw.upstream(upstream).healthy
    upstream.default = whole(chat_answer())
    await health_tick(gw.parts)()  # the poll the lifespan runs every health_interval_s
    assert gw.upstream(upstream).healthy is back
    assert (await gw.chat().done()).status == (200 if back else 503)
