"""Which names a request's ``Host`` header may carry (``allowed_hosts``), checked before any route.

A gateway on loopback without client keys trusts whoever reaches it, meaning every process on the host.
A web page open in a browser on that host can reach it too: its own name, resolved to 127.0.0.1 a moment
after the page loaded (DNS rebinding), makes the browser send the page's requests to the gateway as
same-origin, with the page's name in ``Host``. The loopback names are all a local client uses, so that
gateway refuses the rest; one that requires keys, or listens on other addresses, takes any name unless
``allowed_hosts`` lists some.

A request without a ``Host`` header passes: browsers always send one, and only a browser is the attack.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from starlette.responses import Response

from gateway.server.routes.errors import error_response
from gateway.settings import Settings

#: What a client on this host calls a loopback gateway, and the default list there.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
#: The reason (``X-Sweetspot-Reason``, ``sweetspot_rejections_total``) and error code of a refusal.
HOST_NOT_ALLOWED = "host_not_allowed"
ANY = "*"


def host_name(value: str) -> str:
    """The name part of a ``Host`` value (or of an ``allowed_hosts`` entry): lower-case, without its port or a
    trailing dot, an IPv6 address in brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        name = value if end < 0 else value[: end + 1]
    elif value.count(":") > 1:  # a bare IPv6 address (an entry written without brackets)
        name = f"[{value}]"
    else:
        name = value.partition(":")[0]
    return name.rstrip(".")


def is_loopback(host: str) -> bool:
    """Whether a listening address is the loopback interface only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


class HostRule:
    """The allowed names: exact ones, and ``*.suffix`` for a domain's subdomains."""

    __slots__ = ("_exact", "_suffixes")

    def __init__(self, names: Iterable[str]) -> None:
        exact: set[str] = set()
        suffixes: list[str] = []
        for entry in names:
            if entry.strip().startswith("*."):
                suffixes.append("." + host_name(entry.strip()[2:]))
            else:
                exact.add(host_name(entry))
        self._exact = frozenset(exact)
        self._suffixes = tuple(suffixes)

    def allows(self, host: bytes | None) -> bool:
        if host is None:
            return True
        name = host_name(host.decode("latin-1"))
        return name in self._exact or any(name.endswith(suffix) for suffix in self._suffixes)


def host_rule(settings: Settings) -> HostRule | None:
    """The rule this gateway applies; None when any name is allowed."""
    names: Sequence[str] = settings.allowed_hosts
    if not names:
        keyed = bool(settings.api_keys) or any(tenant.api_keys for tenant in settings.tenants)
        if keyed or not is_loopback(settings.host):
            return None
        names = (*LOOPBACK_NAMES, host_name(settings.host))
    if any(name.strip() == ANY for name in names):
        return None
    return HostRule(names)


def host_refused(host: bytes | None) -> Response:
    shown = host.decode("latin-1")[:100] if host is not None else ""
    return error_response(
        421,
        f"this gateway does not answer for the host {shown!r}: it answers only the names in allowed_hosts",
        code=HOST_NOT_ALLOWED,
        reason=HOST_NOT_ALLOWED,
    )
