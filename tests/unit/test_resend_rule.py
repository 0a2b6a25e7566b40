"""The resend rule (gateway.common.resend): only a kept connection found closed at the write is resent."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.common.resend import STALE_WITHIN_S, ConnectionUse, is_stale


def use(reused: bool) -> ConnectionUse:
    connection = ConnectionUse()
    connection.reused = reused
    return connection


@pytest.mark.parametrize(
    ("exc", "reused", "elapsed_s", "stale"),
    [
        (aiohttp.ServerDisconnectedError(), True, 0.001, True),  # the keep-alive race
        (aiohttp.ClientOSError(104, "reset"), True, 0.001, True),
        (aiohttp.ServerDisconnectedError(), True, STALE_WITHIN_S * 8, False),  # held the request, then died
        (aiohttp.ServerDisconnectedError(), False, 0.001, False),  # a fresh connection: it read the request
        (aiohttp.ClientPayloadError("broken"), True, 0.001, False),  # an answer had begun
    ],
)
def test_only_a_kept_connection_that_fails_at_once_is_stale(
    exc: BaseException, reused: bool, elapsed_s: float, stale: bool
) -> None:
    assert is_stale(exc, use(reused), elapsed_s) is stale


def test_a_refused_connection_is_never_stale() -> None:
    refused = aiohttp.ClientConnectorError(None, OSError(111, "refused"))  # type: ignore[arg-type]
    assert not is_stale(refused, use(True), 0.0)
