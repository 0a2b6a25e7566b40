"""Upstreams found by a name (``dns+http://NAME:PORT``), resolved by a dnsmasq the test controls, under load.

A Kubernetes headless Service's name has one address per ready pod, every pod on the same port. Here the pods
are simulator processes on 127.0.0.2, 127.0.0.3, ... (distinct loopback addresses on Linux), all on one port, and
the name's records are dnsmasq's hosts file, rewritten and re-read (SIGHUP) as the test goes. With clients
sending through the gateway the whole time (the openai SDK, no retries): an address that appears joins and
serves, one that goes drains and leaves, an address that changes is both at once, and a resolver that stops
answering leaves the last good list in place. Not one request fails.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.common.processes import LISTENING, RunningProcess, free_port, sweetspot
from testbed.dnsmasq import Dnsmasq
from testbed.gateway import get_json, metric_value, start_gateway, wait_for

NAME = "vllm.pool.test"
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
INTERVAL_S = 0.25  # discovery_interval_s: the name is resolved again four times a second
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def dnsmasq(module_processes, tmp_path_factory: pytest.TempPathFactory) -> Dnsmasq:
    return Dnsmasq(module_processes, tmp_path_factory.mktemp("dns") / "hosts", {})


@pytest.fixture(scope="module")
def pods(module_processes) -> tuple[int, dict[str, RunningProcess]]:
    """One simulator per address, all on one port: the port, and each address's process."""
    port = free_port()
    started = {
        address: module_processes(
            sweetspot("sim", "--host", address, "--port", str(port), "--time-scale", "20", "--seed", str(i)),
            ready_pattern=LISTENING,
            ready_url="{url}/health",
        )
        for i, address in enumerate(ADDRESSES)
    }
    return port, started


def pod_url(address: str, port: int) -> str:
    return f"http://{address}:{port}"


def prompt_tokens(address: str, port: int) -> float:
    """What the simulator at ``address`` has prefilled so far: it grows while requests reach it."""
    return metric_value(f"{pod_url(address, port)}/metrics", "vllm:prompt_tokens_total") or 0.0


def pool(gateway: str) -> dict[str, dict]:
    """The gateway's upstreams (/state), by URL."""
    return {u["url"]: u for u in get_json(f"{gateway}/state")["upstreams"]}


class Load:
    """Clients sending streamed chat completions through the gateway one after another, until stopped."""

    def __init__(self, gateway: str, model: str, clients: int = 4) -> None:
        self.gateway, self.model, self.clients = gateway, model, clients
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="load", daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT_S)

    def wait_for_more(self, count: int) -> None:
        start = self.ok
        wait_for(lambda: self.ok >= start + count or self.failed, TIMEOUT_S, f"{count} more answers")
        assert not self.failed, self.failed[:3]

    async def _run(self) -> None:
        client = openai.AsyncOpenAI(base_url=f"{self.gateway}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)
        await asyncio.gather(*(self._client(client, i) for i in range(self.clients)))
        await client.close()

    async def _client(self, client: openai.AsyncOpenAI, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                stream = await client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": f"client {index}, request {n}: " + "tell me " * 20}],
                    max_tokens=8,
                    stream=True,
                )
                chunks = [chunk async for chunk in stream]
                if not chunks:
                    raise AssertionError("an empty stream")
                self.ok += 1
            except Exception as exc:  # noqa: BLE001 - every failure is recorded, and the test fails on it
                self.failed.append(f"{type(exc).__name__}: {exc}")


@pytest.fixture
def gateway(processes, dnsmasq: Dnsmasq, pods: tuple[int, dict[str, RunningProcess]]) -> Iterator[RunningProcess]:
    port, _ = pods
    dnsmasq.answer({NAME: ["127.0.0.2", "127.0.0.3"]})
    yield start_gateway(
        processes,
        [f"dns+http://{NAME}:{port}"],
        "--discovery-nameserver",
        dnsmasq.nameserver,
        "--discovery-interval-s",
        str(INTERVAL_S),
        "--log-level",
        "info",
        "--no-access-log",
    )


def test_addresses_come_change_and_go_under_load_and_a_failing_resolver_keeps_the_list(
    gateway: RunningProcess, dnsmasq: Dnsmasq, pods: tuple[int, dict[str, RunningProcess]], module_processes
) -> None:
    port, started = pods
    url = {address: pod_url(address, port) for address in ADDRESSES}
    gw = gateway.url
    # Resolved before the first request: the name's two addresses are the upstreams, named by their URLs.
    assert set(pool(gw)) == {url["127.0.0.2"], url["127.0.0.3"]}
    assert metric_value(f"{gw}/metrics", "sweetspot_upstream_healthy", {"upstream": url["127.0.0.2"]}) == 1
    model = get_json(f"{gw}/v1/models")["data"][0]["id"]

    with Load(gw, model) as load:
        load.wait_for_more(20)

        # An address appears: it joins, at its siblings' limit, and serves.
        before = prompt_tokens("127.0.0.4", port)
        dnsmasq.answer({NAME: ["127.0.0.2", "127.0.0.3", "127.0.0.4"]})
        wait_for(lambda: url["127.0.0.4"] in pool(gw), TIMEOUT_S, "127.0.0.4 joining")
        wait_for(lambda: prompt_tokens("127.0.0.4", port) > before, TIMEOUT_S, "127.0.0.4 serving")
        gateway.wait_for_line(rf"{re.escape(url['127.0.0.4'])}, an address of dns\+http://{NAME}:{port}\) joined", 10)
        load.wait_for_more(20)

        # An address goes: it takes nothing new, finishes what runs, and leaves.
        dnsmasq.answer({NAME: ["127.0.0.3", "127.0.0.4"]})
        wait_for(lambda: url["127.0.0.2"] not in pool(gw), TIMEOUT_S, "127.0.0.2 leaving")
        gateway.wait_for_line(rf"{re.escape(url['127.0.0.2'])}, an address of dns\+http://{NAME}:{port}\) dropped", 10)
        assert metric_value(f"{gw}/metrics", "sweetspot_limit", {"upstream": url["127.0.0.2"]}) is None
        left = prompt_tokens("127.0.0.2", port)
        load.wait_for_more(30)
        assert prompt_tokens("127.0.0.2", port) == left  # nothing reached it after it left

        # An address changes (a pod rescheduled with a new IP): the new one joins, the old one leaves.
        dnsmasq.answer({NAME: ["127.0.0.4", "127.0.0.5"]})
        wait_for(lambda: set(pool(gw)) == {url["127.0.0.4"], url["127.0.0.5"]}, TIMEOUT_S, "127.0.0.3 -> .5")
        before = prompt_tokens("127.0.0.5", port)
        wait_for(lambda: prompt_tokens("127.0.0.5", port) > before, TIMEOUT_S, "127.0.0.5 serving")
        load.wait_for_more(20)

        # The resolver stops answering: the last good list stays, said once, and requests go on.
        dnsmasq.stop()
        gateway.wait_for_line(rf"dns\+http://{NAME}:{port} cannot be resolved .*keeping its last good addresses", 30)
        load.wait_for_more(40)  # several rounds of resolution time out meanwhile
        assert set(pool(gw)) == {url["127.0.0.4"], url["127.0.0.5"]}
        assert all(u["healthy"] and not u["retiring"] for u in pool(gw).values())
        assert gateway.output().count("cannot be resolved") == 1

        # And back: the answers count again (dnsmasq restarted on its port, with one address more).
        restarted = Dnsmasq(
            module_processes, dnsmasq.hosts, {NAME: ["127.0.0.3", "127.0.0.4", "127.0.0.5"]}, dnsmasq.port
        )
        wait_for(lambda: url["127.0.0.3"] in pool(gw), TIMEOUT_S, "127.0.0.3 joining again")
        gateway.wait_for_line(rf"dns\+http://{NAME}:{port} resolves again", 10)
        load.wait_for_more(20)
        restarted.stop()

    assert not load.failed, load.failed[:5]
    assert load.ok >= 150
    assert all(proc.alive() for proc in started.values())


def test_a_name_in_the_upstreams_file_joins_beside_its_urls(
    processes, pods: tuple[int, dict[str, RunningProcess]], tmp_path: Path
) -> None:
    port, _ = pods
    url = {address: pod_url(address, port) for address in ADDRESSES}
    server = Dnsmasq(processes, tmp_path / "hosts", {NAME: ["127.0.0.4", "127.0.0.5"]})
    listing = tmp_path / "upstreams"
    listing.write_text(f"{url['127.0.0.2']}\n")
    proc = start_gateway(
        processes,
        [],
        "--upstreams-file",
        str(listing),
        "--discovery-nameserver",
        server.nameserver,
        "--discovery-interval-s",
        str(INTERVAL_S),
    )
    gw = proc.url
    assert set(pool(gw)) == {url["127.0.0.2"]}
    model = get_json(f"{gw}/v1/models")["data"][0]["id"]
    with Load(gw, model, clients=2) as load:
        load.wait_for_more(10)
        listing.write_text(f"{url['127.0.0.2']}\ndns+http://{NAME}:{port}  # the pool\n")
        wait_for(
            lambda: set(pool(gw)) == {url["127.0.0.2"], url["127.0.0.4"], url["127.0.0.5"]},
            TIMEOUT_S,
            "the name's pods",
        )
        server.answer({NAME: ["127.0.0.5"]})
        wait_for(lambda: url["127.0.0.4"] not in pool(gw), TIMEOUT_S, "127.0.0.4 leaving")
        listing.write_text(f"dns+http://{NAME}:{port}\n{url['127.0.0.3']}\n")  # a URL goes, another comes
        wait_for(lambda: set(pool(gw)) == {url["127.0.0.5"], url["127.0.0.3"]}, TIMEOUT_S, "the name's pod and .3")
        # The resolver goes: beside a URL that still stands, the name keeps its last good address.
        server.stop()
        proc.wait_for_line(rf"dns\+http://{NAME}:{port} cannot be resolved .*keeping its last good addresses", 30)
        load.wait_for_more(10)
        assert set(pool(gw)) == {url["127.0.0.5"], url["127.0.0.3"]}
    assert not load.failed, load.failed[:5]
