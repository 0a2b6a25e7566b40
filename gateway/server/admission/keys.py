"""The one key check every route uses: which configured key, if any, a request presents.

A client presents its key as ``Authorization: Bearer <key>`` (OpenAI's SDK) or ``x-api-key: <key>``
(Anthropic's SDK), on every route alike. A key is compared as bytes in constant time against every
configured key (the time says nothing of which matched), so a header with any bytes at all, non-ASCII
included, is a clean refusal, never an exception.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")

_BEARER = b"bearer "


def bearer_token(authorization: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (None for anything else)."""
    if not authorization or authorization[:7].lower() != _BEARER:
        return None
    token = authorization[7:].strip()
    return token or None


def presented_keys(authorization: bytes | None, api_key: bytes | None) -> tuple[bytes, ...]:
    """The keys a request presents: its bearer token, then its ``x-api-key`` value (either may be absent)."""
    found = []
    token = bearer_token(authorization)
    if token is not None:
        found.append(token)
    if api_key:
        stripped = api_key.strip()
        if stripped:
            found.append(stripped)
    return tuple(found)


class KeyRing(Generic[T]):
    """Configured keys, each naming what it grants (a tenant, or the operator's access)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Iterable[tuple[str, T]]) -> None:
        self._entries = [(key.encode(), value) for key, value in entries]

    def __bool__(self) -> bool:
        return bool(self._entries)

    def find(self, authorization: bytes | None, api_key: bytes | None) -> T | None:
        """What the first presented key that matches grants; None when none matches."""
        for presented in presented_keys(authorization, api_key):
            found: T | None = None
            for key, value in self._entries:  # every key compared, whichever matches
                if hmac.compare_digest(presented, key) and found is None:
                    found = value
            if found is not None:
                return found
        return None
