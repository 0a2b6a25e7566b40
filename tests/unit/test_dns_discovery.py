"""Upstreams given as a name to resolve (gateway/server/upstream/dns_discovery.py): the ``dns+`` form and the
nameserver setting, what is refused at start (exit 2), the rule that a bad answer keeps the last good addresses
(with a resolver the test scripts behind the same protocol as the real ones), and the real resolvers: the
system's on ``localhost``, and dnspython's against a small DNS server on a loopback port that answers, fails and
stays silent as the test says."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
from pydantic import ValidationError

from gateway.common.processes import sweetspot
from gateway.server.upstream.discovery import BadUpstreamsFile, parse_upstreams
from gateway.server.upstream.dns_discovery import (
    DnsName,
    DnsUpstreams,
    NameserverResolver,
    ResolveError,
    SystemResolver,
    is_dns,
    make_resolver,
    parse_dns_name,
    parse_nameserver,
)
from gateway.settings import Settings

# --- the dns+ form --------------------------------------------------------------------------------------------


def test_a_name_to_resolve_and_the_urls_its_addresses_make() -> None:
    name = parse_dns_name("dns+http://vllm.llm.svc.cluster.local:8000/")
    assert name == DnsName("dns+http://vllm.llm.svc.cluster.local:8000", "http", "vllm.llm.svc.cluster.local", 8000, "")
    assert name.url("10.0.0.7") == "http://10.0.0.7:8000"
    assert name.url("fd00::7") == "http://[fd00::7]:8000"  # IPv6 in brackets
    tls = parse_dns_name("dns+https://vllm.example:8443/v1")
    assert (tls.scheme, tls.port, tls.url("10.0.0.8")) == ("https", 8443, "https://10.0.0.8:8443/v1")
    assert is_dns("dns+http://a:1") and is_dns("DNS+https://a:1") and not is_dns("http://a:1")


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("dns+ftp://vllm:8000", "dns+http://NAME:PORT"),
        ("dns+http://vllm", "give the port"),
        ("dns+http://vllm:0", "give the port"),
        ("dns+http://vllm:eighty", "port must be a number"),
        ("dns+http://vllm:99999", "port must be a number"),
        ("dns+http://:8000", "no name"),
        ("dns+http://vllm:8000?x=1", "nothing more"),
        ("dns+http://user@vllm:8000", "nothing more"),
    ],
)
def test_a_bad_name_to_resolve_says_what_is_wrong(entry: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_dns_name(entry)
    with pytest.raises(BadUpstreamsFile, match=f"line 2: .*{re.escape(why)}"):
        parse_upstreams(f"http://ok:1\n{entry}\n")


def test_the_file_and_the_settings_take_names_beside_urls() -> None:
    text = "http://a:1\ndns+http://pool.test:8000/  # the pool\ndns+http://pool.test:8000\n"
    assert parse_upstreams(text) == ["http://a:1", "dns+http://pool.test:8000"]
    settings = Settings(upstreams="http://a:1/,dns+https://pool.test:8443")
    assert settings.upstreams == ["http://a:1", "dns+https://pool.test:8443"]
    with pytest.raises(ValidationError, match="give the port"):
        Settings(upstreams=["dns+http://pool.test"])
    with pytest.raises(ValidationError, match="not an http://"):
        Settings(upstreams=["ftp://a:1"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:5353", ("127.0.0.1", 5353)), ("10.0.0.10", ("10.0.0.10", 53)), ("[::1]:5353", ("::1", 5353))],
)
def test_the_nameserver_is_an_address_and_a_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_nameserver(text) == expected
    assert Settings(upstreams=["http://a:1"], discovery_nameserver=text).discovery_nameserver == text


@pytest.mark.parametrize("text", ["kube-dns:53", "127.0.0.1:0", "127.0.0.1:x", "[::1]5353", "::1:5353:"])
def test_a_nameserver_that_is_no_address_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="discovery_nameserver"):
        parse_nameserver(text)


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWEETSPOT_")}
    return subprocess.run(sweetspot("serve", *args), capture_output=True, text=True, timeout=60, env=clean)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("-u", "dns+ftp://vllm:8000"), "dns+http://NAME:PORT"),
        (("-u", "dns+http://vllm.llm.svc"), "give the port"),
        (("-u", "dns+http://vllm:8000", "--discovery-nameserver", "kube-dns"), "discovery_nameserver"),
    ],
)
def test_bad_discovery_settings_are_one_line_and_exit_2(args: tuple[str, ...], expected: str) -> None:
    result = _serve(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and expected in result.stderr and "Traceback" not in result.stderr


# --- the last good addresses ----------------------------------------------------------------------------------


class ScriptedResolver:
    """A resolver whose answers the test sets: a list of addresses, or an exception to raise."""

    def __init__(self) -> None:
        self.answers: dict[str, list[str] | Exception] = {}
        self.asked: list[str] = []

    async def addresses(self, host: str) -> list[str]:
        self.asked.append(host)
        answer = self.answers.get(host, [])
        if isinstance(answer, Exception):
            raise answer
        return list(answer)


POOL = parse_dns_name("dns+http://pool.test:8000")
OTHER = parse_dns_name("dns+https://other.test:8443/v1")


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_addresses_become_sorted_urls_and_a_change_is_reported() -> None:
    resolver = ScriptedResolver()
    dns = DnsUpstreams(resolver)
    resolver.answers = {"pool.test": ["10.0.0.3", "fd00::1", "10.0.0.2", "10.0.0.3"], "other.test": ["10.1.0.1"]}
    assert await dns.refresh([POOL, OTHER])
    assert dns.urls([POOL, OTHER]) == [
        "http://10.0.0.2:8000",
        "http://10.0.0.3:8000",
        "http://[fd00::1]:8000",
        "https://10.1.0.1:8443/v1",
    ]
    assert dns.origin("http://10.0.0.3:8000") == POOL.entry and dns.origin("http://10.9.9.9:8000") is None
    resolver.answers["pool.test"] = ["fd00::1", "10.0.0.2", "10.0.0.3"]  # the same addresses in another order
    assert not await dns.refresh([POOL, OTHER])
    resolver.answers["pool.test"] = ["10.0.0.2", "10.0.0.4"]  # one went, one came
    assert await dns.refresh([POOL, OTHER])
    assert dns.urls([POOL]) == ["http://10.0.0.2:8000", "http://10.0.0.4:8000"]
    assert await dns.refresh([POOL])  # a name no longer configured is forgotten
    assert dns.urls([POOL, OTHER]) == ["http://10.0.0.2:8000", "http://10.0.0.4:8000"]


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (ResolveError("SERVFAIL"), "cannot be resolved (SERVFAIL)"),
        (OSError("a resolver's bug"), "cannot be resolved (OSError: a resolver's bug)"),
        ([], "has no address"),
        (["not-an-address"], "has no address"),
    ],
)
async def test_a_bad_answer_keeps_the_last_good_addresses_said_once(
    bad: list[str] | Exception, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    resolver = ScriptedResolver()
    dns = DnsUpstreams(resolver)
    resolver.answers["pool.test"] = ["10.0.0.2", "10.0.0.3"]
    assert await dns.refresh([POOL])
    caplog.clear()
    resolver.answers["pool.test"] = bad
    for _ in range(4):  # it stays bad for several rounds
        assert not await dns.refresh([POOL])
        assert dns.urls([POOL]) == ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]
    lines = [line for line in _errors(caplog) if "pool.test" in line and "no IP address" not in line]
    assert len(lines) == 1, lines  # one line for the streak, not one a round
    assert (
        said in lines[0] and "keeping its last good addresses (http://10.0.0.2:8000, http://10.0.0.3:8000)" in lines[0]
    )
    resolver.answers["pool.test"] = ["10.0.0.3"]
    caplog.clear()
    assert await dns.refresh([POOL])
    assert dns.urls([POOL]) == ["http://10.0.0.3:8000"]
    assert any("resolves again" in r.getMessage() for r in caplog.records)
    resolver.answers["pool.test"] = bad
    assert not await dns.refresh([POOL])
    assert len([line for line in _errors(caplog) if said in line]) == 1  # a new streak is said again


async def test_garbage_in_an_answer_is_said_and_the_good_addresses_count(caplog: pytest.LogCaptureFixture) -> None:
    resolver = ScriptedResolver()
    dns = DnsUpstreams(resolver)
    resolver.answers["pool.test"] = ["10.0.0.2", "vllm-0"]
    assert await dns.refresh([POOL])
    assert dns.urls([POOL]) == ["http://10.0.0.2:8000"]
    assert any("no IP address" in line and "vllm-0" in line for line in _errors(caplog))


async def test_a_name_that_never_resolved_has_no_upstream_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    resolver = ScriptedResolver()
    resolver.answers["pool.test"] = ResolveError("timed out")
    dns = DnsUpstreams(resolver)
    assert not await dns.refresh([POOL])
    assert dns.urls([POOL]) == []
    assert any("no upstream for it until it resolves" in line for line in _errors(caplog))


# --- the real resolvers ---------------------------------------------------------------------------------------


async def test_the_system_resolver_reads_the_hosts_file() -> None:
    found = await SystemResolver(timeout_s=5).addresses("localhost")
    assert "127.0.0.1" in found or "::1" in found
    assert isinstance(make_resolver(None, 1.0), SystemResolver)
    assert isinstance(make_resolver("127.0.0.1:5353", 1.0), NameserverResolver)


class _Server(asyncio.DatagramProtocol):
    """A DNS server on a loopback UDP port: ``records`` answers A and AAAA queries (a name it lacks is NXDOMAIN),
    ``rcode`` fails every query with that code, ``silent`` answers nothing (a timeout)."""

    def __init__(self) -> None:
        self.records: dict[str, list[str]] = {}
        self.rcode: int | None = None
        self.silent = False
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.silent or self.transport is None:
            return
        query = dns.message.from_wire(data)
        response = dns.message.make_response(query)
        question = query.question[0]
        name = question.name.to_text().rstrip(".")
        if self.rcode is not None:
            response.set_rcode(self.rcode)
        elif name not in self.records:
            response.set_rcode(dns.rcode.NXDOMAIN)
        else:
            family = ":" if question.rdtype == dns.rdatatype.AAAA else "."
            addresses = [a for a in self.records[name] if family in a]
            if addresses:
                rdtype = dns.rdatatype.to_text(question.rdtype)
                response.answer.append(dns.rrset.from_text(question.name, 0, "IN", rdtype, *addresses))
        self.transport.sendto(response.to_wire(), addr)


@contextmanager
def _closing(transport: asyncio.BaseTransport) -> Iterator[None]:
    try:
        yield
    finally:
        transport.close()


async def test_the_nameserver_resolver_asks_its_server_for_both_families() -> None:
    loop = asyncio.get_running_loop()
    transport, server = await loop.create_datagram_endpoint(_Server, local_addr=("127.0.0.1", 0))
    with _closing(transport):
        port = transport.get_extra_info("sockname")[1]
        resolver = make_resolver(f"127.0.0.1:{port}", 0.5)
        server.records = {"pool.test": ["10.0.0.2", "10.0.0.3", "fd00::2"], "v4.test": ["10.0.0.9"]}
        assert sorted(await resolver.addresses("pool.test")) == ["10.0.0.2", "10.0.0.3", "fd00::2"]
        assert await resolver.addresses("v4.test") == ["10.0.0.9"]  # no AAAA record: an empty answer for it
        assert await resolver.addresses("gone.test") == []  # NXDOMAIN
        server.rcode = dns.rcode.SERVFAIL
        with pytest.raises(ResolveError, match="SERVFAIL"):
            await resolver.addresses("pool.test")
        server.rcode, server.silent = None, True
        with pytest.raises(ResolveError, match=r"timed out|lifetime"):
            await resolver.addresses("pool.test")
