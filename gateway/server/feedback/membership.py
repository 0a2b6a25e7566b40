"""Upstreams that come and go without a restart: the configured ``upstreams`` united with ``upstreams_file``
(:mod:`gateway.server.upstream.discovery`), applied to the running gateway when the file changes (checked every
``discovery_interval_s``) and at once on ``SIGHUP`` (:meth:`Membership.reload`, which also reads the
configuration's own ``upstreams`` again: flags, ``SWEETSPOT_UPSTREAMS``, the TOML file). A ``dns+`` entry of either
stands for the addresses its name resolves to (:mod:`gateway.server.upstream.dns_discovery`), resolved at start
before the first request and again every ``discovery_interval_s``: an address that appears joins, one that goes
leaves, as a URL the file adds or drops would.

A new upstream is polled once (health and models) before it joins, then added to the pool, to the admission
queue's targets, to the health poll and the backend scrape, and gets a controller. That controller starts from
what its siblings have learned: the median of the current limits of the other upstreams serving the same model
(:func:`sibling_limit`), in the knee search's cruise phase, not at ``initial_limit`` in slow start. The
assumption, stated: upstreams serving one model run on the same class of hardware with the same server
settings, so one's sweet spot is a good first guess for another's; the controller corrects a wrong guess as it
would any change (a knee lower down shows as latency or a throughput that stopped paying). With no sibling (the
first server of a model, or a model list that could not be read) it starts as any upstream does.

A removed upstream stops taking requests at once (out of every request's eligible list, and unhealthy for the
queue), finishes what runs on it (its permits come back as always), and once nothing runs on it is dropped from
the pool, the queue's targets and the control loop, and its metric series are removed. Listed again before it
was dropped, it simply serves again.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Callable

from gateway.control.config import StartPoint
from gateway.control.window import SlidingWindow
from gateway.server.admission.limiter import Limiter
from gateway.server.feedback.capacity_export import serving_model
from gateway.server.feedback.control_loop import ControlLoop
from gateway.server.parts import Gateway, bind_upstream_gauges
from gateway.server.upstream.discovery import Change, diff, united
from gateway.server.upstream.dns_discovery import DnsName, is_dns, parse_dns_name
from gateway.server.upstream.health import check_health
from gateway.server.upstream.pool import OTHER_MODELS, Upstream
from gateway.server.upstream.upstream_headers import poll_headers

log = logging.getLogger("sweetspot.upstreams")

#: What /readyz and /state say of an upstream leaving.
RETIRING = "removed from the configuration; finishing what runs"


def sibling_limit(upstreams: list[Upstream], newcomer: Upstream) -> int | None:
    """The median (the lower of the two middle ones) of the current limits of the upstreams in ``upstreams``
    other than ``newcomer``, not retiring, serving the model ``newcomer`` serves; None when there is none.
    While ``newcomer``'s model list is unknown, its siblings are the others when they all serve one model."""
    others = [u for u in upstreams if u is not newcomer and not u.retiring]
    model = serving_model(newcomer)
    if model == OTHER_MODELS:
        served = {serving_model(u) for u in others}
        siblings = others if len(served) == 1 else []
    else:
        siblings = [u for u in others if serving_model(u) == model]
    if not siblings:
        return None
    return int(statistics.median_low(u.limiter.limit for u in siblings))


class Membership:
    """Keeps the gateway's upstreams in step with the configuration while it runs."""

    def __init__(
        self, gateway: Gateway, control_loop: ControlLoop, reread: Callable[[], list[str]] | None = None
    ) -> None:
        self.gateway = gateway
        self.control_loop = control_loop
        self.configured = list(gateway.settings.upstreams)
        self.reread = reread  # the configuration's upstreams read again (SIGHUP); None: they never change
        self._next_index = len(gateway.pool.upstreams) + 1
        self._lock = asyncio.Lock()
        self._origins: dict[str, str] = {}  # an upstream found by a dns+ name -> that name, while it is in the pool

    def entries(self) -> list[str]:
        """What the configuration lists: URLs and dns+ names."""
        listing = self.gateway.upstreams_file
        return united(self.configured, listing.urls if listing is not None else [])

    def names(self) -> list[DnsName]:
        return [parse_dns_name(entry) for entry in self.entries() if is_dns(entry)]

    def wanted(self) -> list[str]:
        """The upstreams the configuration stands for now: its URLs, and the last good addresses of its names."""
        entries = self.entries()
        dns = self.gateway.dns
        resolved = dns.urls(self.names()) if dns is not None else []
        return united([entry for entry in entries if not is_dns(entry)], resolved)

    async def resolve(self) -> bool:
        """Resolve the configuration's dns+ names again; whether any name's addresses changed."""
        dns = self.gateway.dns
        if dns is None:
            return False
        return await dns.refresh(self.names())

    async def start(self) -> None:
        """At start, before the first request: the names' addresses join, each as an upstream configured by its
        URL would (``initial_limit``, slow start: its siblings have learned nothing yet)."""
        if await self.resolve():
            await self.apply(fresh=True)

    async def tick(self) -> None:
        """The discovery loop's round: the file's list when it changed, the names resolved again, then drop what
        finished retiring."""
        listing = self.gateway.upstreams_file
        listed = listing is not None and listing.poll() is not None
        resolved = await self.resolve()
        if listed or resolved:
            await self.apply()
        self.drop_finished()

    async def reload(self) -> Change:
        """Read the configuration's upstream list again (the file, and flags/env/TOML through ``reread``) and
        apply it now: what SIGHUP does. A configuration that cannot be read keeps the last good list."""
        if self.reread is not None:
            try:
                self.configured = united(self.reread())
            except Exception as exc:  # noqa: BLE001 - a bad TOML file must not take the gateway down
                log.error("SIGHUP: the configuration cannot be read (%s); keeping its last good upstreams", exc)
        listing = self.gateway.upstreams_file
        if listing is not None:
            listing.poll(force=True)
        await self.resolve()
        change = await self.apply()
        self.drop_finished()
        log.info("SIGHUP: upstreams re-read", extra={"added": change.added, "removed": change.removed})
        return change

    async def apply(self, *, fresh: bool = False) -> Change:
        """Make the upstreams serving the ones :meth:`wanted` lists (``fresh``: those joining start as at start,
        not from their siblings). An empty list changes nothing (logged): a gateway with no upstream serves nobody,
        and an empty list is far likelier a mistake than a wish."""
        async with self._lock:
            wanted = self.wanted()
            pool = self.gateway.pool
            if not wanted:
                if any(not u.retiring for u in pool):  # with none serving, the names' own lines said why
                    log.error("the configuration lists no upstream; keeping the ones serving")
                return Change([], [])
            change = diff([u.name for u in pool if not u.retiring], wanted)
            dns = self.gateway.dns
            for url in change.added:
                origin = dns.origin(url) if dns is not None else None
                if origin is not None:
                    self._origins[url] = origin
            # Joins first: a server replacing another (one removed, one added at once) learns from the one it
            # replaces, and takes requests before that one stops.
            for url in change.added:
                await self.join(url, fresh=fresh)
            for url in change.removed:
                self.retire(pool.by_name[url])
            if change:
                log.warning("upstreams changed", extra={"added": change.added, "removed": change.removed})
            return change

    def _shown(self, upstream: Upstream) -> str:
        """How the logs name an upstream: its public name, its URL, and the dns+ name it is an address of."""
        origin = self._origins.get(upstream.name)
        where = f"{upstream.name}, an address of {origin}" if origin is not None else upstream.name
        return f"{upstream.public_name} ({where})"

    async def join(self, url: str, *, fresh: bool = False) -> Upstream:
        gateway, settings = self.gateway, self.gateway.settings
        upstream = gateway.pool.by_name.get(url)
        if upstream is not None:  # listed again while it was retiring: it serves again once healthy
            upstream.retiring = False
            await self._poll(upstream)
            gateway.queue.dispatch()
            return upstream
        upstream = Upstream(
            url,
            Limiter(url, settings.initial_limit),
            SlidingWindow(settings.window_s),
            public_name=f"upstream-{self._next_index}",
        )
        self._next_index += 1
        await self._poll(upstream)  # its health and models known before it takes a request
        limit = None if fresh else sibling_limit(gateway.pool.upstreams, upstream)
        gateway.pool.add(upstream)
        gateway.queue.targets[upstream.name] = upstream
        bind_upstream_gauges(gateway.metrics, upstream)
        self.control_loop.attach(upstream, StartPoint(limit=limit) if limit is not None else None, swept=False)
        log.info(
            "upstream %s joined (%s) at limit %d%s",
            self._shown(upstream),
            "healthy" if upstream.healthy else "not healthy yet",
            upstream.limiter.limit,
            " (its siblings' median)" if limit is not None else "",
        )
        gateway.queue.dispatch()
        return upstream

    def retire(self, upstream: Upstream) -> None:
        """No new request for ``upstream`` from now on; what runs on it finishes."""
        upstream.retiring = True
        upstream.healthy = False
        upstream.health_error = RETIRING
        upstream.health_detail = None
        log.info(
            "upstream %s leaves: %d requests running on it finish first",
            self._shown(upstream),
            upstream.limiter.inflight,
        )

    def drop_finished(self) -> list[str]:
        """Drop every retiring upstream that has nothing running any more; their names."""
        gateway = self.gateway
        gone = [u.name for u in gateway.pool if u.retiring and u.limiter.inflight == 0]
        for name in gone:
            upstream = gateway.pool.remove(name)
            gateway.queue.targets.pop(name, None)
            self.control_loop.detach(name)
            if gateway.router is not None:
                gateway.router.forget(name)  # its prefixes and adapters left with it
            gateway.metrics.forget_upstream(name)
            log.info("upstream %s dropped", self._shown(upstream))
            self._origins.pop(name, None)
        return gone

    async def _poll(self, upstream: Upstream) -> None:
        settings = self.gateway.settings
        timeout = max(min(settings.health_interval_s, 5.0), 1.0)
        await check_health(self.gateway.client.poll_session, upstream, poll_headers(settings.upstream_api_key), timeout)
