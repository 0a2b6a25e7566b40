"""Upstreams found by a dns+ name go through the membership path of the upstreams file
(gateway/server/feedback/membership.py): resolved before the first request, joined and left as the answers
change, the last good addresses kept while the resolver fails. The resolver here is scripted (the same protocol
as the real ones, tests/unit/test_dns_discovery.py); tests/integration/test_discovery_dns.py runs the real one
against dnsmasq under load."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gateway.server.app import create_app
from gateway.server.feedback.membership import RETIRING, Membership
from gateway.server.parts import Gateway
from gateway.server.routes.proxied import ProxiedRoutes
from gateway.server.upstream.dns_discovery import DnsUpstreams, ResolveError
from gateway.settings import Settings
from tests.component.conftest import Stage
from tests.unit.test_dns_discovery import ScriptedResolver

NAME = "pool.test"


def _with(resolver: ScriptedResolver) -> Any:
    """An app factory whose gateway resolves its names with ``resolver``."""

    def factory(settings: Settings) -> ProxiedRoutes:
        gateway = Gateway.build(settings)
        gateway.dns = DnsUpstreams(resolver)
        return ProxiedRoutes(create_app(settings, gateway=gateway), gateway)

    return factory


async def test_a_names_addresses_join_before_the_first_request_and_follow_its_answers(
    stage: Stage, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sweetspot.upstreams")
    first = await stage.upstream()
    port = int(first.url.rsplit(":", 1)[1])
    entry = f"dns+http://{NAME}:{port}"
    resolver = ScriptedResolver()
    resolver.answers[NAME] = ["127.0.0.1"]
    gw = await stage.gateway(entry, app_factory=_with(resolver), discovery_interval_s=3600, control_enabled=True)
    membership: Membership = gw.app.app.state.membership
    assert [u.url for u in gw.parts.pool] == [first.url]  # the name's address, named by its URL
    joined = gw.parts.pool.by_name[first.url]
    assert joined.healthy and joined.limiter.limit == 4  # at start: initial_limit, as a configured URL
    assert (await gw.chat().done()).status == 200
    joined.limiter.set_limit(9)

    # A resolver that fails, then answers nothing: the address stays and serves.
    for bad in (ResolveError("SERVFAIL"), []):
        resolver.answers[NAME] = bad
        await membership.tick()
        assert [u.url for u in gw.parts.pool] == [first.url] and not joined.retiring
        assert (await gw.chat().done()).status == 200

    # A second address joins at its sibling's limit (nothing listens there: it joins unhealthy, takes nothing).
    caplog.clear()
    resolver.answers[NAME] = ["127.0.0.1", "127.0.0.9"]
    await membership.tick()
    second = gw.parts.pool.by_name[f"http://127.0.0.9:{port}"]
    assert second.limiter.limit == 9 and not second.healthy
    assert any(f"http://127.0.0.9:{port}, an address of {entry}) joined" in r.getMessage() for r in caplog.records)
    assert (await gw.chat().done()).status == 200

    # The first address goes: it leaves (nothing ran on it), the name's other address is what is left.
    resolver.answers[NAME] = ["127.0.0.9"]
    await membership.tick()
    assert joined.retiring and joined.health_error == RETIRING
    assert [u.url for u in gw.parts.pool] == [f"http://127.0.0.9:{port}"]
    assert any(f"{first.url}, an address of {entry}) dropped" in r.getMessage() for r in caplog.records)


async def test_a_name_with_no_address_at_start_serves_once_it_resolves(stage: Stage) -> None:
    first = await stage.upstream()
    port = int(first.url.rsplit(":", 1)[1])
    resolver = ScriptedResolver()
    resolver.answers[NAME] = ResolveError("timed out")
    gw = await stage.gateway(
        f"dns+http://{NAME}:{port}", app_factory=_with(resolver), discovery_interval_s=3600, routing="prefix"
    )
    assert list(gw.parts.pool) == [] and gw.parts.router is not None  # a name may stand for several
    refused = await gw.chat().done()
    assert refused.status == 503
    resolver.answers[NAME] = ["127.0.0.1"]
    await gw.app.app.state.membership.tick()
    assert [u.url for u in gw.parts.pool] == [first.url]
    assert (await gw.chat().done()).status == 200
