"""Upstreams given as a name to re-resolve: ``dns+http://vllm.llm.svc.cluster.local:8000`` stands for one upstream
per address of that name (its A and AAAA records), ``http://ADDRESS:8000`` (an IPv6 address in brackets), resolved
again every ``discovery_interval_s``. A Kubernetes headless Service's name has one address per ready pod, so the
gateway follows the pods as they come and go; what it does with the addresses (join, drain, leave) is
:class:`~gateway.server.feedback.membership.Membership`'s, the same as for ``upstreams_file``.

An upstream found this way is named by its address URL everywhere (the ``upstream`` label of the metrics, /state,
the logs): that is the server the gateway talks to and measures, and a name stands for several. The name it came
from is in the log lines of its join and its leave.

Names are resolved by the system's resolver (``getaddrinfo``: /etc/hosts, the search domains of
/etc/resolv.conf), or, with ``discovery_nameserver``, by asking that DNS server directly (dnspython). A name that
cannot be resolved (a timeout, SERVFAIL, REFUSED) or has no address (NXDOMAIN, no record) keeps its last good
addresses: one log line when it turns bad, one when it resolves again. A pool emptied by a flaky resolver would
refuse every request; a stale address that went away only fails its health poll.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

log = logging.getLogger("sweetspot.upstreams")

#: The schemes of an upstream to resolve, and the scheme of the upstreams its addresses become.
DNS_SCHEMES = {"dns+http": "http", "dns+https": "https"}


def is_dns(entry: str) -> bool:
    """Whether ``entry`` is a name to resolve (``dns+...``) rather than one upstream's URL."""
    return entry.lower().startswith("dns+")


class DnsName(NamedTuple):
    """A ``dns+http(s)://host:port[/path]`` entry: what to resolve, and how each address becomes a URL."""

    entry: str  # as configured, without a trailing "/": how the logs name it
    scheme: str  # http or https
    host: str
    port: int
    path: str  # "" or a base path such as "/v1"

    def url(self, address: str) -> str:
        """The upstream URL of one of the name's addresses."""
        host = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def parse_dns_name(entry: str) -> DnsName:
    """The :class:`DnsName` of ``entry``; ValueError, saying what is wrong, when it is not
    ``dns+http://host:port[/path]`` or ``dns+https://...`` (the port is required: a Service's port is part of
    what it offers, and a silent 80 would look like a dead pool)."""
    entry = entry.strip().rstrip("/")
    try:
        parts = urlsplit(entry)
        port = parts.port
    except ValueError:  # a port that is no number, or out of range
        raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535") from None
    scheme = DNS_SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        raise ValueError(f"{entry!r}: a name to resolve is dns+http://NAME:PORT or dns+https://NAME:PORT")
    host = parts.hostname
    if not host:
        raise ValueError(f"{entry!r}: no name to resolve")
    if port is None or port == 0:
        raise ValueError(f"{entry!r}: give the port (dns+{scheme}://{host}:PORT)")
    if parts.username is not None or parts.query or parts.fragment or any(ch.isspace() for ch in entry):
        raise ValueError(f"{entry!r}: a name to resolve is dns+{scheme}://NAME:PORT[/path], nothing more")
    return DnsName(entry, scheme, host, port, parts.path)


def parse_nameserver(text: str) -> tuple[str, int]:
    """``discovery_nameserver``'s address and port: ``127.0.0.1:5353``, ``[::1]:5353``, or an address alone (port
    53). ValueError when the host is not an IP address (a name would need a resolver to find the resolver)."""
    text = text.strip()
    host, port_text = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"discovery_nameserver {text!r}: expected [IPv6]:PORT")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"discovery_nameserver {text!r}: expected ADDRESS:PORT with an IP address, e.g. 127.0.0.1:5353"
        ) from None
    if not port_text:
        return host, 53
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"discovery_nameserver {text!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)


class ResolveError(Exception):
    """The resolver gave no answer (a timeout, SERVFAIL, REFUSED, no server reachable); the message says which."""


class Resolver(Protocol):
    """What turns a name into its addresses."""

    async def addresses(self, host: str) -> list[str]:
        """The IPv4 and IPv6 addresses of ``host``; [] when it has none (NXDOMAIN, no A or AAAA record).
        Raises :class:`ResolveError` when the resolver cannot say."""
        ...


class SystemResolver:
    """The system's resolver, through the event loop's ``getaddrinfo``. That runs in one of a few shared threads
    and cannot be cancelled: a lookup still running when its round gives up is waited for by the next round
    rather than started again, so a resolver that hangs holds one thread, not one more each round."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._running: dict[str, asyncio.Future[list[Any]]] = {}

    async def addresses(self, host: str) -> list[str]:
        lookup = self._running.get(host)
        if lookup is None or lookup.done():
            lookup = asyncio.ensure_future(asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM))
            lookup.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved: never "lost"
            self._running[host] = lookup
        try:
            infos = await asyncio.wait_for(asyncio.shield(lookup), timeout=self.timeout_s)
        except TimeoutError:
            raise ResolveError(f"no answer within {self.timeout_s:g}s") from None
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return []
            raise ResolveError(exc.strerror or str(exc)) from None
        return [str(info[4][0]) for info in infos]


class NameserverResolver:
    """One DNS server asked directly (``discovery_nameserver``), for the A and the AAAA records, with no cache:
    every round sees the server's current answer. The name is asked as given (no search domains)."""

    def __init__(self, address: str, port: int, timeout_s: float) -> None:
        import dns.asyncresolver

        self._resolver = dns.asyncresolver.Resolver(configure=False)
        self._resolver.nameservers = [address]
        self._resolver.port = port
        self._resolver.lifetime = timeout_s
        self._resolver.timeout = timeout_s

    async def addresses(self, host: str) -> list[str]:
        """The answer of each record type that has one. A type whose query fails while the other answers counts
        as having no record (dnsmasq refuses the AAAA query of a name it has only an A for, for instance); both
        failing is a :class:`ResolveError`."""
        results = await asyncio.gather(self._query(host, "A"), self._query(host, "AAAA"))
        errors = [result for result in results if isinstance(result, str)]
        if len(errors) == len(results):
            raise ResolveError("; ".join(errors))
        return [address for result in results if isinstance(result, list) for address in result]

    async def _query(self, host: str, rdtype: str) -> list[str] | str:
        """The addresses of one record type ([] for NXDOMAIN or none), or why the query failed."""
        import dns.exception
        import dns.resolver

        try:
            answer = await self._resolver.resolve(host, rdtype, raise_on_no_answer=False, search=False)
        except dns.resolver.NXDOMAIN:
            return []
        except dns.exception.DNSException as exc:
            return f"{rdtype}: {exc}"
        return [str(getattr(record, "address", record)) for record in answer]


def make_resolver(nameserver: str | None, timeout_s: float) -> Resolver:
    """``discovery_nameserver``'s resolver when it is set, else the system's."""
    if nameserver is None:
        return SystemResolver(timeout_s)
    address, port = parse_nameserver(nameserver)
    return NameserverResolver(address, port, timeout_s)


class DnsUpstreams:
    """The last good addresses of each name, refreshed by :meth:`refresh`; the upstream URLs they make."""

    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self.found: dict[str, list[str]] = {}  # entry -> its last good upstream URLs, sorted
        self._bad: set[str] = set()  # entries whose last round was bad (said once, until they resolve again)

    async def refresh(self, names: Iterable[DnsName]) -> bool:
        """Resolve ``names`` (all at once); whether any name's URLs changed. Names no longer asked for are
        forgotten; a name resolved badly keeps its last good URLs."""
        wanted = {name.entry: name for name in names}
        changed = False
        for gone in [entry for entry in self.found if entry not in wanted]:
            del self.found[gone]
            changed = True
        self._bad &= set(wanted)
        results = await asyncio.gather(*(self._resolve(name) for name in wanted.values()))
        for name, urls in zip(wanted.values(), results, strict=True):
            if urls is None or urls == self.found.get(name.entry):
                continue
            self.found[name.entry] = urls
            changed = True
        return changed

    def urls(self, names: Iterable[DnsName]) -> list[str]:
        """The upstream URLs of ``names``, in their order, each name's sorted."""
        return [url for name in names for url in self.found.get(name.entry, [])]

    def origin(self, url: str) -> str | None:
        """The name ``url`` is an address of (the first, when several resolve to it); None when none is."""
        return next((entry for entry, urls in self.found.items() if url in urls), None)

    async def _resolve(self, name: DnsName) -> list[str] | None:
        """The name's URLs, or None when this round's answer does not count (logged when it turns bad)."""
        try:
            answer = await self.resolver.addresses(name.host)
        except ResolveError as exc:
            self._bad_round(name, f"cannot be resolved ({exc})")
            return None
        except Exception as exc:  # noqa: BLE001 - a resolver's bug must not stop the other names
            self._bad_round(name, f"cannot be resolved ({type(exc).__name__}: {exc})")
            return None
        addresses: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
        garbage: list[str] = []
        for text in answer:
            try:
                addresses.add(ipaddress.ip_address(text))
            except ValueError:
                garbage.append(text)
        if garbage and name.entry not in self._bad:
            log.error("%s: the resolver answered %r, which is no IP address; ignored", name.entry, garbage)
        if not addresses:
            self._bad_round(name, "has no address (NXDOMAIN, or no A or AAAA record)")
            return None
        urls = [name.url(str(address)) for address in sorted(addresses, key=lambda a: (a.version, int(a)))]
        if name.entry in self._bad:
            self._bad.discard(name.entry)
            log.warning("%s resolves again: %s", name.entry, ", ".join(urls))
        return urls

    def _bad_round(self, name: DnsName, why: str) -> None:
        """Say once that ``name`` turned bad (not again each round while it stays bad)."""
        if name.entry not in self._bad:
            self._bad.add(name.entry)
            kept = self.found.get(name.entry)
            log.error(
                "%s %s; keeping %s",
                name.entry,
                why,
                f"its last good addresses ({', '.join(kept)})" if kept else "no upstream for it until it resolves",
            )
