"""The headers the gateway sends upstream: which credential, and whether a stream keeps its connection."""

from __future__ import annotations

from gateway import __version__

#: Sent with every upstream request, as the sessions' own header (an upstream's logs name the gateway). A
#: session that skips aiohttp's own User-Agent instead builds a set of skipped headers per request.
SESSION_HEADERS = {"User-Agent": f"sweetspot/{__version__}"}


def request_headers(
    upstream_api_key: str | None,
    authorization: bytes | None,
    request_id: str,
    *,
    stream: bool,
    keep_alive: bool = False,
    api: dict[str, str] | None = None,
    api_key: bytes | None = None,
) -> dict[str, str]:
    """Headers for an upstream request: the configured upstream key, else the client's ``authorization``
    (which the caller passes only when the gateway holds no keys of its own).

    A streamed request asks for its connection to be closed afterwards unless the upstream is known to
    keep it usable (``keep_alive``: :attr:`Upstream.streams_keep_alive`, vLLM). llama-server closes it
    anyway while announcing keep-alive, and such connections, pooled, pile up dead, so a request could
    draw one on each of its resends and fail. Asked in the request, the server says ``Connection: close``
    in its reply and the client never pools the connection, however fast the stream ends. vLLM's Python
    front end, on the other hand, pays for every connection it accepts, and its kept connections behave.

    ``api``: headers that belong to the client's API (``anthropic-version``), passed on as they came;
    ``api_key``: a client's ``x-api-key``, passed on under the same rule as its ``authorization``."""
    headers = {"content-type": "application/json", "x-request-id": request_id, **(api or {})}
    if stream:
        headers["accept"] = "text/event-stream"
        if not keep_alive:
            headers["connection"] = "close"
    if upstream_api_key:
        headers["authorization"] = f"Bearer {upstream_api_key}"
    else:
        if authorization:
            headers["authorization"] = authorization.decode("latin-1")
        if api_key:
            headers["x-api-key"] = api_key.decode("latin-1")
    return headers


def poll_headers(upstream_api_key: str | None) -> dict[str, str]:
    """Headers for the gateway's own requests (health poll, backend scrape): only the upstream key."""
    return {"authorization": f"Bearer {upstream_api_key}"} if upstream_api_key else {}
