"""Upstreams that come and go without a restart (gateway/server/feedback/membership.py): under a steady load, a
second upstream joins through ``upstreams_file`` and the first leaves, with no request failed; the one leaving
finishes the stream it runs, the one joining starts at its sibling's limit, and the leaver's series go. SIGHUP's
reload reads the configuration's upstreams again."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.server.app import create_server_app
from gateway.server.feedback.membership import RETIRING, Membership
from gateway.server.upstream.health import health_tick
from gateway.settings import Settings
from tests.component.conftest import DONE, ROLE, Gate, Stage, stream, token, until


def _series_of(registry: CollectorRegistry, url: str) -> list[str]:
    return [
        sample.name
        for family in registry.collect()
        for sample in family.samples
        if sample.labels.get("upstream") == url
    ]


async def test_an_upstream_joins_and_another_leaves_under_load_with_no_request_failed(
    stage: Stage, tmp_path: Path
) -> None:
    first, second = await stage.upstream(), await stage.upstream()
    listing = tmp_path / "upstreams"
    listing.write_text(f"# the pool\n{first.url}\n")
    gate = Gate()
    first.then(stream(ROLE, token("a"), gate, token("b"), DONE))  # the stream that runs while it leaves
    gw = await stage.gateway(
        upstreams_file=listing, discovery_interval_s=0.02, control_enabled=True, control_interval_s=3600
    )
    control_loop = gw.app.app.state.control_loop
    assert [u.url for u in gw.parts.pool] == [first.url]
    gw.parts.pool.by_name[first.url].limiter.set_limit(7)  # what the first one has learned

    held = gw.chat(stream=True)
    await held.wait_for(b'"a"')

    statuses: list[int | None] = []
    stop = asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            exchange = await gw.chat().done()
            statuses.append(exchange.status)

    clients = [asyncio.create_task(client()) for _ in range(3)]
    await until(lambda: len(statuses) >= 10)

    listing.write_text(f"{first.url}\n{second.url}\n")  # a second server joins
    await until(lambda: second.url in gw.parts.pool.by_name)
    joined = gw.parts.pool.by_name[second.url]
    assert joined.limiter.limit == 7  # its sibling's limit, not initial_limit (4) in slow start
    assert second.url in gw.parts.queue.targets and second.url in control_loop.controls
    await until(lambda: len(second.posts()) >= 5)

    listing.write_text(f"{second.url}\n")  # the first one leaves
    leaving = gw.parts.pool.by_name[first.url]
    await until(lambda: leaving.retiring)
    assert leaving.health_error == RETIRING
    await until(lambda: leaving.limiter.inflight == 1)  # only the held stream runs there now
    sent_to_first = len(first.posts())
    reached_second = len(second.posts())
    await until(lambda: len(second.posts()) >= reached_second + 20)
    assert len(first.posts()) == sent_to_first  # nothing new went to the one leaving
    assert first.url in gw.parts.pool.by_name  # not dropped while its stream runs
    assert _series_of(gw.parts.metrics.registry, first.url)

    gate.open()
    await held.done()
    assert held.status == 200 and b'"b"' in held.body and DONE in held.body  # the leaver finished its stream
    await until(lambda: first.url not in gw.parts.pool.by_name)
    assert first.url not in gw.parts.queue.targets and first.url not in control_loop.controls
    assert _series_of(gw.parts.metrics.registry, first.url) == []
    assert _series_of(gw.parts.metrics.registry, second.url)

    stop.set()
    await asyncio.gather(*clients)
    assert statuses and set(statuses) == {200}, statuses
    assert [u.url for u in gw.parts.pool] == [second.url]
    gw.assert_settled()


async def test_sighup_reads_the_configured_upstreams_again(stage: Stage) -> None:
    first, second = await stage.upstream(), await stage.upstream()
    configured = [first.url]

    def factory(resolved: Settings) -> object:
        return create_server_app(resolved, reread=lambda: list(configured))

    gw = await stage.gateway(first, app_factory=factory)
    membership: Membership = gw.app.app.state.membership
    configured[:] = [first.url, second.url]
    change = await membership.reload()  # what the SIGHUP handler runs
    assert change.added == [second.url] and change.removed == []
    assert (await gw.chat().done()).status == 200
    configured[:] = [second.url]
    change = await membership.reload()
    assert change.removed == [first.url]
    assert first.url not in gw.parts.pool.by_name  # nothing ran on it: dropped at once
    for _ in range(3):
        assert (await gw.chat().done()).status == 200
    assert len(second.posts()) >= 3
    configured[:] = []
    assert not await membership.reload()  # an empty list changes nothing
    assert [u.url for u in gw.parts.pool] == [second.url]

    # The real signal: the app's handler runs the same reload.
    assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN, None)
    configured[:] = [first.url, second.url]
    os.kill(os.getpid(), signal.SIGHUP)
    await until(lambda: first.url in gw.parts.pool.by_name)
    assert not gw.parts.pool.by_name[first.url].retiring


async def test_a_health_poll_running_as_an_upstream_leaves_does_not_bring_it_back(stage: Stage) -> None:
    first, second = await stage.upstream(), await stage.upstream()
    gw = await stage.gateway(first, second)
    membership: Membership = gw.app.app.state.membership
    leaving = gw.parts.pool.by_name[first.url]
    leaving.limiter.acquire()  # a request runs on it: it is not dropped at once
    asked = first.polled["/v1/models"]
    poll = asyncio.create_task(health_tick(gw.parts)())
    await first.wait(lambda: first.polled["/v1/models"] > asked)  # the poll is waiting for its last answer
    assert not poll.done()
    membership.retire(leaving)
    await poll
    assert leaving.retiring and not leaving.healthy
    assert gw.parts.pool.eligible("m") == [second.url]
    leaving.limiter.release()
    assert membership.drop_finished() == [first.url]


async def test_a_server_replacing_another_starts_at_the_limit_of_the_one_it_replaces(stage: Stage) -> None:
    first, second = await stage.upstream(), await stage.upstream()
    configured = [first.url]
    gw = await stage.gateway(first, app_factory=lambda s: create_server_app(s, reread=lambda: list(configured)))
    gw.parts.pool.by_name[first.url].limiter.set_limit(6)
    configured[:] = [second.url]  # one step: the old one out, the new one in
    change = await gw.app.app.state.membership.reload()
    assert change.added == [second.url] and change.removed == [first.url]
    assert gw.parts.pool.by_name[second.url].limiter.limit == 6
    assert [u.url for u in gw.parts.pool] == [second.url]
    assert (await gw.chat().done()).status == 200
