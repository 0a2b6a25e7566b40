"""The replicas' shared state against a real ``redis-server``: entries cross, expire, and Redis loss
degrades to "no peers" without an error, and comes back by itself."""

from __future__ import annotations

import asyncio

from gateway.server.feedback.share_board import ShareBoard
from testbed.redis_server import start_redis


def test_replicas_see_each_other_and_stale_entries_go(processes) -> None:
    _, url = start_redis(processes)
    clock = [1000.0]

    async def scenario() -> None:
        a = ShareBoard(url, ttl_s=10, replica="a", wall_clock=lambda: clock[0])
        b = ShareBoard(url, ttl_s=10, replica="b", wall_clock=lambda: clock[0])
        c = ShareBoard(url, ttl_s=10, replica="c", wall_clock=lambda: clock[0])
        assert await a.exchange("http://backend:8000", 40, 30) is None  # alone so far
        peers = await b.exchange("http://backend:8000", 20, 12)
        assert peers is not None and (peers.replicas, peers.demand, peers.limit) == (1, 40, 30)
        assert peers.leader is not None and peers.leader.replica == "a"  # the lowest id whose limit binds
        assert await b.exchange("http://other:8000", 5, 5) is None  # upstreams do not mix
        await c.exchange("http://backend:8000", 10, 4)
        peers = await a.exchange("http://backend:8000", 40, 30)
        assert peers is not None and (peers.replicas, peers.demand, peers.limit) == (2, 30, 16)
        assert peers.leader is None  # a leads
        clock[0] += 11  # b and c stop publishing: after the TTL they no longer count
        assert await a.exchange("http://backend:8000", 40, 30) is None
        await c.exchange("http://backend:8000", 10, 4)
        await c.leave()  # and one that leaves is gone at once
        assert await a.exchange("http://backend:8000", 40, 30) is None
        for board in (a, b, c):
            await board.close()

    asyncio.run(scenario())


def test_losing_redis_degrades_to_no_peers_and_recovers(processes) -> None:
    proc, url = start_redis(processes)
    port = int(url.rsplit(":", 1)[1].split("/")[0])

    async def publish_and_read(a: ShareBoard, b: ShareBoard) -> object:
        await b.exchange("u", 10, 5)
        return await a.exchange("u", 20, 10)

    async def scenario() -> None:
        a = ShareBoard(url, ttl_s=10, replica="a")
        b = ShareBoard(url, ttl_s=10, replica="b")
        assert await publish_and_read(a, b) is not None
        proc.stop()
        assert await a.exchange("u", 20, 10) is None and a.failing  # no exception, just no peers
        assert await a.exchange("u", 20, 10) is None
        start_redis(processes, port)
        assert await publish_and_read(a, b) is not None and not a.failing
        await a.close()
        await b.close()

    asyncio.run(scenario())
