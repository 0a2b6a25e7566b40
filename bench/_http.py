"""Reading JSON answers in the benchmarks: check the status and say what came back, never a bare KeyError.

A gateway that refuses a request (the connection cap, a missing admin key, a drain) answers an OpenAI-shaped
error body; read as the answer that was expected, it surfaces as ``KeyError: 'queue'`` far from its cause.
:func:`get_json` raises :class:`BenchError` with the URL, the status and the start of the body instead, and
`dig` does the same for a key that is not there.
"""

from __future__ import annotations

import json
import os
from typing import Any

import aiohttp

#: The operator's key, when the gateways a bench starts inherit one from the environment: /state and /metrics
#: need it then (``admin_api_key``).
ADMIN_KEY_ENV = "SWEETSPOT_ADMIN_API_KEY"


class BenchError(RuntimeError):
    """A server answered something other than what the benchmark needs; the message says what it got."""


def admin_headers() -> dict[str, str]:
    """The admin key as a bearer token, when ``SWEETSPOT_ADMIN_API_KEY`` is set (the gateways inherit it)."""
    key = os.environ.get(ADMIN_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


async def get_json(session: aiohttp.ClientSession, url: str, *, headers: dict[str, str] | None = None) -> Any:
    """GET ``url`` and return its JSON, or raise :class:`BenchError` saying what answered instead."""
    async with session.get(url, headers=headers) as resp:
        text = await resp.text()
        if resp.status != 200:
            hint = ""
            if resp.status == 401:
                hint = f" (an admin route: set {ADMIN_KEY_ENV} to the gateway's admin key)"
            raise BenchError(f"GET {url} answered {resp.status}{hint}: {text[:500]}")
        try:
            return json.loads(text)
        except ValueError:
            raise BenchError(f"GET {url} answered 200 but not JSON ({resp.content_type}): {text[:500]}") from None


async def get_text(session: aiohttp.ClientSession, url: str, *, headers: dict[str, str] | None = None) -> str:
    """GET ``url`` and return its body, or raise :class:`BenchError` saying what answered instead."""
    async with session.get(url, headers=headers) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise BenchError(f"GET {url} answered {resp.status}: {text[:500]}")
        return text


def dig(answer: Any, *path: str | int, what: str = "the answer") -> Any:
    """``answer[path[0]][path[1]]...``, or :class:`BenchError` naming the missing part and showing the answer."""
    current = answer
    for depth, key in enumerate(path):
        try:
            current = current[key]
        except (KeyError, IndexError, TypeError):
            where = "".join(f"[{k!r}]" for k in path[: depth + 1])
            raise BenchError(f"{what} has no {where}: {str(answer)[:500]}") from None
    return current
