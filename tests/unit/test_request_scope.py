"""What a request may name: the Host names a gateway answers (``allowed_hosts``), and the stored responses a
tenant may reach (``ResponseAffinity`` with owners)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gateway.server.routes.hosts import host_name, host_rule, is_loopback
from gateway.server.upstream.response_affinity import RESPONSE_ID, ResponseAffinity
from gateway.settings import Settings

UP = ["http://127.0.0.1:9"]


@pytest.mark.parametrize(
    "value,name",
    [
        ("localhost:8080", "localhost"),
        ("LocalHost.", "localhost"),
        ("[::1]:8080", "[::1]"),
        ("[::1]", "[::1]"),
        ("::1", "[::1]"),
        ("127.0.0.1", "127.0.0.1"),
        ("evil.example:80", "evil.example"),
    ],
)
def test_host_names_are_compared_without_port_case_or_trailing_dot(value: str, name: str) -> None:
    assert host_name(value) == name


def test_a_loopback_gateway_without_keys_answers_only_loopback_names() -> None:
    rule = host_rule(Settings(upstreams=UP))
    assert rule is not None
    for host in (b"localhost:8080", b"127.0.0.1:8080", b"[::1]:1", b"LOCALHOST", None):
        assert rule.allows(host), host
    for host in (b"evil.example", b"localhost.evil.example", b"127.0.0.1.nip.io:8080", b"[::2]", b""):
        assert not rule.allows(host), host


@pytest.mark.parametrize(
    "settings",
    [
        {"api_keys": ["k"]},
        {"tenants": [{"name": "a", "api_keys": ["k"]}]},
        {"host": "0.0.0.0"},
        {"host": "10.0.0.5"},
        {"allowed_hosts": "*"},
        {"allowed_hosts": ["a.example", "*"]},
    ],
)
def test_keys_another_address_or_a_star_allow_any_name(settings: dict) -> None:
    assert host_rule(Settings(upstreams=UP, **settings)) is None


def test_a_listed_name_or_domain_is_what_passes() -> None:
    rule = host_rule(Settings(upstreams=UP, host="0.0.0.0", allowed_hosts="gw.example:8080, *.corp.example"))
    assert rule is not None
    assert rule.allows(b"gw.example") and rule.allows(b"GW.example:1") and rule.allows(b"a.b.corp.example")
    assert not rule.allows(b"corp.example") and not rule.allows(b"xcorp.example") and not rule.allows(b"localhost")


def test_loopback_addresses() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", ""))


@dataclass
class Tenant:
    name: str


def test_with_owners_a_stored_response_is_its_tenants_only() -> None:
    now = [0.0]
    owned = ResponseAffinity(max_entries=10, ttl_s=60, owned=True, clock=lambda: now[0])
    alpha, beta = Tenant("alpha"), Tenant("beta")
    owned.remember("resp_1", "up-1", alpha)
    assert owned.upstream_of("resp_1", alpha) == "up-1"
    assert owned.upstream_of("resp_1", beta) is None
    assert owned.upstream_of("resp_1", None) is None
    assert owned.upstream_of("resp_2", alpha) is None
    now[0] = 61.0
    assert owned.upstream_of("resp_1", alpha) is None and len(owned) == 0  # expired


def test_without_owners_every_caller_is_the_one_tenant() -> None:
    shared = ResponseAffinity(max_entries=10, ttl_s=60)
    shared.remember("resp_1", "up-1", Tenant("default"))
    assert shared.upstream_of("resp_1", Tenant("anyone")) == "up-1"
    assert shared.upstream_of("resp_1") == "up-1"


@pytest.mark.parametrize("rid", ["resp_0123abcdef", "resp-unknown", "x" * 128, "msg_A1"])
def test_response_ids_of_the_form_vllm_and_openai_use(rid: str) -> None:
    assert RESPONSE_ID.fullmatch(rid)


@pytest.mark.parametrize("rid", ["..", ".", "a/b", "a.b", "x" * 129, "", "a%2Fb", "résp", "a b"])
def test_anything_else_is_no_response_id(rid: str) -> None:
    assert RESPONSE_ID.fullmatch(rid) is None
