"""The upstream client: one pooled aiohttp session that sends a request and waits for its status line,
deciding what a failure means for the request: sent again on the same upstream (a kept connection found
closed at the write, which the server never read: :mod:`gateway.common.resend`), failed over to another
upstream (the first provably did not process it: its first attempt was refused or could not connect, or
the engine itself answered 503 or 429 with its own JSON error body, or 404 saying it has no such model: a LoRA
adapter unloaded since its model list was read), or answered with an error (anything else: the upstream may have
run it, and a duplicated generation is worse than an error). A resend that
cannot connect proves nothing about the attempt before it, so it is never taken for "not processed"; nor is
a 503 page from a proxy in front of the engine, which may have passed the request on.

The client is aiohttp because it spends less CPU per request than httpx, which decides how much of a
small CPU the gateway leaves to everything else (``python -m bench.upstream_client`` compares them; the
README has the figures).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import aiohttp

from gateway.common.resend import ConnectionUse, ReuseAwareConnector, is_stale
from gateway.server.upstream.silence import SilenceBound
from gateway.server.upstream.upstream_headers import SESSION_HEADERS
from gateway.telemetry.metrics import GatewayMetrics

STALE_RETRIES = 2  # resends of a request whose kept connection was found closed (see gateway.common.resend)
#: Answers that say the upstream refused the request without running it: another upstream may take it.
REFUSAL_STATUSES = frozenset({429, 503})
#: The largest 404 body read to tell whether it says the model does not exist (an engine's is a few hundred bytes).
MODEL_MISSING_MAX_BYTES = 16 * 1024


class UpstreamFailed(Exception):
    """The upstream failed before its answer began. ``not_processed``: it provably did not run the request
    (another upstream may); ``connect_failed``: nothing listens there (its health is down); ``model_missing``: it
    answered 404, the model does not exist there (its model list is stale)."""

    def __init__(
        self,
        message: str,
        *,
        not_processed: bool,
        connect_failed: bool = False,
        status: int | None = None,
        body: bytes | None = None,
        retry_after: str | None = None,
        model_missing: bool = False,
    ) -> None:
        super().__init__(message)
        self.not_processed = not_processed
        self.connect_failed = connect_failed
        self.model_missing = model_missing
        self.status = status  # the upstream's own error status, when it answered one
        self.body = body
        self.retry_after = retry_after  # the upstream's own Retry-After, if it sent one


class UpstreamTimeout(Exception):
    """The upstream did not start its answer in time: the request was cancelled there."""


@dataclass
class UpstreamReply:
    """An upstream response whose status and headers have arrived; the body is still unread."""

    response: aiohttp.ClientResponse
    idle_timeout_s: float | None = None  # a stream's bound on silence, armed by :meth:`bound_silence`
    body: bytes | None = None  # the whole body, when it was read already (a 404's, to see what it says)
    silence: SilenceBound | None = None  # the bound armed by :meth:`bound_silence`

    @property
    def status(self) -> int:
        return self.response.status

    def bound_silence(self) -> None:
        """From now on, a silence of ``idle_timeout_s`` in the body ends its read with a ``TimeoutError``
        (:class:`~gateway.server.upstream.silence.SilenceBound`: at least the bound, ended within 1.25 times
        it). Until then a stream waits for its headers and first token under ``first_token_timeout_s`` alone,
        which may be the longer: the upstream's queue and prefill are no silence of a decoding server."""
        if self.idle_timeout_s is None or self.silence is not None or self.response.content.is_eof():
            return  # not a stream, bounded already, or its body has all arrived
        self.silence = SilenceBound(self.response.content, self.idle_timeout_s)

    def release(self) -> None:
        """The body has been read whole: its connection goes back to the pool."""
        self._unbound()
        self.response.release()

    def close(self) -> None:
        self._unbound()
        self.response.close()

    def _unbound(self) -> None:
        if self.silence is not None:
            self.silence.cancel()
            self.silence = None


class UpstreamClient:
    """One pooled aiohttp session for all upstream traffic.

    ``total_timeout_s`` bounds a whole request that is not streamed. A stream has no total bound: it may run
    as long as it keeps producing. Its headers and first token are bounded by the caller (one first-token
    deadline for both), and from then on it ends when the upstream is silent for ``stream_idle_timeout_s``
    between two reads (:meth:`UpstreamReply.bound_silence`)."""

    def __init__(
        self, *, connect_timeout_s: float, total_timeout_s: float, stream_idle_timeout_s: float, metrics: GatewayMetrics
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._total_timeout_s = total_timeout_s
        self._stream_idle_timeout_s = stream_idle_timeout_s
        self._buffered = aiohttp.ClientTimeout(total=total_timeout_s, connect=connect_timeout_s)
        # No total and no sock_read: aiohttp's sock_read would also run while the headers are awaited.
        self._streamed = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s)
        self._metrics = metrics
        self._session: aiohttp.ClientSession | None = None
        self._poll_session: aiohttp.ClientSession | None = None

    @property
    def poll_session(self) -> aiohttp.ClientSession:
        """The session of the gateway's own GETs (health poll, backend scrape). A pool apart from the requests'
        own, so a proxied request never goes out on a connection a poll left behind: a request's kept
        connection was last used by a request, and :mod:`gateway.common.resend`'s rule is about those."""
        if self._poll_session is None:
            self._poll_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4, enable_cleanup_closed=True),
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=self._buffered,
                headers=SESSION_HEADERS,
            )
        return self._poll_session

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Idle connections are dropped before the servers' own 5 s (uvicorn's under vLLM, cpp-httplib's
            # under llama-server) would close them under a request being written.
            connector = ReuseAwareConnector(limit=0, keepalive_timeout=4, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector,
                # One session serves every client: an upstream's cookies must not reach the next client.
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=self._buffered,
                headers=SESSION_HEADERS,
            )
        return self._session

    async def close(self) -> None:
        for session in (self._session, self._poll_session):
            if session is not None:
                await session.close()
        self._session = self._poll_session = None

    async def send(
        self,
        base_url: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        *,
        name: str,
        stream: bool,
    ) -> UpstreamReply:
        """POST and wait for the status line: a whole answer's within its ``total_timeout_s`` (aiohttp's total
        bound, which goes on to cover its body). A stream has no bound here: its caller holds one deadline for
        the head and the first token (``first_token_timeout_s``, the request's watch), one timer for both.
        ``name`` is how the upstream is called in messages a client may read (never its URL). A streamed reply's
        body has no bound on silence until the caller arms it (:meth:`UpstreamReply.bound_silence`, at the first
        token), unless its status is not 200 (an error's body: armed at once).

        Raises :class:`UpstreamFailed` when the answer never began, was a 5xx/429 (its ``not_processed`` says
        whether another upstream may be tried) or a 404 saying the model does not exist (``model_missing``: not
        run, so another upstream may take it), :class:`UpstreamTimeout` when a whole answer did not begin in
        time. A kept connection found closed is sent again, up to :data:`STALE_RETRIES` times."""
        url = base_url + path
        timeout = self._streamed if stream else self._buffered
        loop = asyncio.get_running_loop()
        for tried in range(STALE_RETRIES + 1):
            use = ConnectionUse()
            sent_at = loop.time()
            try:
                with use:
                    response = await self.session.post(url, data=body, headers=headers, timeout=timeout)
                break
            except aiohttp.ClientConnectorError as exc:
                raise UpstreamFailed(
                    f"cannot connect to {name}", not_processed=tried == 0, connect_failed=True
                ) from exc
            except aiohttp.ConnectionTimeoutError as exc:
                raise UpstreamFailed(
                    f"cannot connect to {name} within {self._connect_timeout_s:g} s",
                    not_processed=tried == 0,
                    connect_failed=True,
                ) from exc
            except TimeoutError as exc:
                raise UpstreamTimeout(f"{name} did not answer within {self._total_timeout_s:g} s") from exc
            except aiohttp.ClientError as exc:
                if is_stale(exc, use, loop.time() - sent_at):
                    if tried < STALE_RETRIES:
                        self._metrics.upstream_retries.labels(base_url, "stale_connection").inc()
                        continue
                    raise UpstreamFailed(f"{name} closed every kept connection", not_processed=True) from exc
                # A fresh connection, or a kept one that held the request: the upstream may be running it.
                raise UpstreamFailed(
                    f"{name} dropped the connection before answering ({type(exc).__name__})", not_processed=False
                ) from exc
        reply = UpstreamReply(response, idle_timeout_s=self._stream_idle_timeout_s if stream else None)
        if response.status != 200:
            reply.bound_silence()  # an error's body, not a stream: no token to wait for
        if response.status >= 500 or response.status in REFUSAL_STATUSES:
            payload = await _read_quietly(response)
            raise UpstreamFailed(
                f"{name} answered {response.status}",
                not_processed=response.status in REFUSAL_STATUSES and _engine_error(response, payload),
                status=response.status,
                body=payload,
                retry_after=response.headers.get("Retry-After"),
            )
        if response.status == 404 and _small_json(response):
            reply.body = await _read_quietly(response)
            if model_missing(reply.body):
                message = f"{name} does not serve the model"
                raise UpstreamFailed(message, not_processed=True, status=404, body=reply.body, model_missing=True)
        return reply

    async def forward(
        self,
        method: str,
        base_url: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        *,
        name: str,
        timeout_s: float,
    ) -> tuple[int, str, bytes]:
        """A light request (tokenize, count tokens, a stored response): sent once, read whole. Returns the
        status, content type and body; raises :class:`UpstreamFailed` when no answer came."""
        try:
            async with asyncio.timeout(timeout_s):
                async with self.session.request(method, base_url + path, data=body, headers=headers) as response:
                    payload = await response.read()
                    return response.status, response.headers.get("content-type", "application/json"), payload
        except (TimeoutError, aiohttp.ClientError) as exc:
            connect = isinstance(exc, aiohttp.ClientConnectorError)
            raise UpstreamFailed(
                f"{name} did not answer ({type(exc).__name__})", not_processed=connect, connect_failed=connect
            ) from exc


def _engine_error(response: aiohttp.ClientResponse, payload: bytes) -> bool:
    """Whether an error answer is the engine's own (vLLM's, llama-server's, SGLang's: a JSON error object),
    not a proxy's page in front of it."""
    if response.content_type != "application/json":
        return False
    try:
        body = json.loads(payload)
    except ValueError:
        return False
    return isinstance(body, dict) and (isinstance(body.get("error"), dict) or body.get("object") == "error")


def _small_json(response: aiohttp.ClientResponse) -> bool:
    """A JSON body of a declared length small enough to read whole before deciding what it means."""
    length = response.content_length
    return response.content_type == "application/json" and length is not None and length <= MODEL_MISSING_MAX_BYTES


def model_missing(payload: bytes) -> bool:
    """Whether a 404's body says the model does not exist: vLLM's ``{"error": {"message": "The model `x` does not
    exist.", "type": "NotFoundError", "code": 404}}`` (before 0.10, the same fields at the top with ``"object":
    "error"``), or a ``model_not_found`` code (OpenAI's, the gateway's own, llama-server's router). A 404 for
    anything else (a stored response, a route the server lacks) is not one."""
    try:
        body = json.loads(payload)
    except ValueError:
        return False
    if not isinstance(body, dict):
        return False
    error = body.get("error")
    if not isinstance(error, dict):
        if body.get("object") != "error":
            return False
        error = body
    if error.get("code") == "model_not_found":
        return True
    message = error.get("message")
    if not isinstance(message, str):
        return False
    message = message.lower()
    return "model" in message and ("does not exist" in message or "not found" in message)


async def _read_quietly(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.read()
    except (TimeoutError, aiohttp.ClientError):
        return b""
    finally:
        response.release()
