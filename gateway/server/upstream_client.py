"""The upstream client: one pooled aiohttp session that sends a request and waits for its status line,
telling apart the failures that happened before the upstream answered (another upstream may be tried)
from those after.

The client is aiohttp because it spends less CPU per request than httpx, which decides how much of a
small CPU the gateway leaves to everything else (``python -m bench.upstream_client`` compares them; the
README has the figures).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from gateway.server.resend import STALE_CONNECTION_ERRORS, resend_if_stale
from gateway.telemetry.metrics import GatewayMetrics

STALE_RETRIES = 2  # resends of a request whose pooled connection was dead (see gateway.server.resend)


class UpstreamUnavailable(Exception):
    """The upstream could not be reached or failed before sending a byte: another may be tried."""

    def __init__(self, message: str, *, status: int | None = None, body: bytes | None = None,
                 connect_failed: bool = False, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.connect_failed = connect_failed
        self.retry_after = retry_after  # the upstream's own Retry-After, if it sent one


@dataclass
class UpstreamReply:
    """An upstream response whose status and headers have arrived; the body is still unread."""

    response: aiohttp.ClientResponse

    @property
    def status(self) -> int:
        return self.response.status

    def close(self) -> None:
        self.response.close()


class UpstreamClient:
    """One pooled aiohttp session for all upstream traffic."""

    def __init__(self, *, connect_timeout_s: float, total_timeout_s: float, metrics: GatewayMetrics) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._total_timeout_s = total_timeout_s
        self._metrics = metrics
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Idle connections are dropped before the servers' own 5 s (uvicorn's under vLLM, cpp-httplib's
            # under llama-server) would close them under a request being written.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector,
                # One session serves every client: an upstream's cookies must not reach the next client.
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=self._total_timeout_s, connect=self._connect_timeout_s),
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, base_url: str, path: str, body: bytes, headers: dict[str, str]) -> UpstreamReply:
        """POST and wait for the status line. Raises :class:`UpstreamUnavailable` for failures that
        happened before any byte of an answer (connect errors, 5xx), retrying stale connections."""
        url = base_url + path
        retries = self._metrics.upstream_retries
        try:
            response = await resend_if_stale(
                lambda: self.session.post(url, data=body, headers=headers), resends=STALE_RETRIES,
                on_resend=lambda: retries.labels(base_url, "stale_connection").inc())
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnavailable(f"cannot connect to {base_url}: {exc}", connect_failed=True) from exc
        except STALE_CONNECTION_ERRORS as exc:
            raise UpstreamUnavailable(f"{base_url} closed the connection: {exc}") from exc
        except asyncio.TimeoutError:
            raise
        except aiohttp.ClientError as exc:  # anything else before an answer: try elsewhere
            raise UpstreamUnavailable(f"{base_url}: {type(exc).__name__}: {exc}") from exc
        if response.status >= 500:
            payload = await _read_quietly(response)
            raise UpstreamUnavailable(
                f"{base_url} answered {response.status}", status=response.status, body=payload,
                retry_after=response.headers.get("Retry-After"),
            )
        return UpstreamReply(response)


async def _read_quietly(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.read()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return b""
    finally:
        response.release()
