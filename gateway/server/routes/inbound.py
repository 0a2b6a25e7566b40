"""The client's side of a proxied request: the headers the gateway reads, and the body."""

from __future__ import annotations

import asyncio
import re
from typing import Protocol

from starlette.types import Receive

from gateway.common.connection_loss import ConnectionLoss
from gateway.server.relay.request_watch import ClientGone

#: An X-Request-Id the gateway accepts from a client (echoed back, and logged beside the gateway's own id, which
#: is what goes upstream): short, printable ASCII.
_REQUEST_ID = re.compile(rb"[!-~]{1,128}")
#: A tenant name a header may carry: anything else is ignored (the request is the default tenant's).
_TENANT = re.compile(rb"[A-Za-z0-9_.-]{1,64}")


class RequestHeaders:
    """The few request headers the gateway reads, found in one pass over the raw ASGI list (which the
    server gives lower-cased). Starlette's ``Headers`` decodes every header again on each lookup.

    ``authorization`` stays bytes (it is compared as bytes, whatever a client sent); an ``X-Request-Id``
    that is long or not printable ASCII is ignored, so the gateway makes one of its own."""

    __slots__ = (
        "api",
        "api_key",
        "authorization",
        "content_length",
        "content_type",
        "priority",
        "request_id",
        "tenant",
    )

    def __init__(
        self, raw: list[tuple[bytes, bytes]], priority_header: str, tenant_header: bytes | None = None
    ) -> None:
        self.authorization: bytes | None = None
        self.api_key: bytes | None = None  # Anthropic's SDK sends its key as x-api-key
        self.api: dict[str, str] = {}  # headers that are part of the API's contract (anthropic-version, -beta)
        self.content_length: str | None = None
        self.content_type: bytes | None = None
        self.request_id: str | None = None
        self.priority: str | None = None
        self.tenant: bytes | None = None  # only read when a tenant header is configured (a trusted network)
        priority_name = priority_header.lower().encode("latin-1")
        for name, value in raw:
            if name == b"authorization":
                self.authorization = value
            elif name == b"content-length":
                self.content_length = value.decode("latin-1")
            elif name == b"content-type":
                self.content_type = value
            elif name == b"x-request-id":
                self.request_id = value.decode("ascii") if _REQUEST_ID.fullmatch(value) else None
            elif name == priority_name:
                self.priority = value.decode("latin-1")
            elif name == b"x-api-key":
                self.api_key = value
            elif name.startswith(b"anthropic-"):
                self.api[name.decode("latin-1")] = value.decode("latin-1")
            elif name == tenant_header and _TENANT.fullmatch(value):
                self.tenant = value

    @property
    def is_json(self) -> bool:
        """``Content-Type: application/json`` (any parameters): what no HTML form or simple cross-site
        request can send, so a browser page cannot drive the gateway without a CORS preflight."""
        if self.content_type is None:
            return False
        return self.content_type.split(b";", 1)[0].strip().lower() == b"application/json"


class BodyRefused(Exception):
    """A request body the gateway will not read to its end: ``status`` and ``reason`` say why."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s


class ReceivingBudget(Protocol):
    """The bytes all bodies being received at once may hold (the admission queue's ``max_queued_bytes``)."""

    def hold_receiving(self, nbytes: int) -> bool: ...

    def release_receiving(self, nbytes: int) -> None: ...

    def retry_after(self) -> int: ...


#: A declared body at least this large is held in the budget whole before any of it is read; a smaller one comes
#: in a message or two (uvicorn pauses a connection past 64 KiB of body not yet read) and is held by none.
HOLD_DECLARED_FROM = 64 * 1024


async def read_body(
    receive: Receive,
    *,
    limit: int,
    declared_length: str | None,
    timeout_s: float,
    budget: ReceivingBudget | None = None,
    loss: ConnectionLoss | None = None,
) -> bytes:
    """The whole request body, read by every route that takes one, in one bounded, timed way.

    Raises :class:`BodyRefused` with 413 as soon as the body says, or turns out, to be over ``limit`` bytes
    (nothing past the limit is kept, so a body bomb costs at most ``limit`` bytes), with 408 when the whole
    body has not arrived within ``timeout_s`` of the first read (a trickled body holds a connection no
    longer), and :class:`ClientGone` when the client hangs up first. A body that came in one message (the
    usual case) is returned as it came, without copying.

    With a ``budget``, a body is held in it while it arrives and given back once it is whole: a large body
    that declares its length is held whole before any of it is read (refused at once when it does not fit),
    one sent in chunks of unknown total piece by piece (refused when a piece does not fit). A refusal is a
    429 with Retry-After.

    ``loss``: the request's connection as the front door sees it
    (:func:`~gateway.common.connection_loss.connection_loss`; None under another server). When it says the whole
    body has arrived already (:attr:`~gateway.common.connection_loss.ConnectionLoss.body_received`), no read
    can wait: the body is read without arming the timer, which costs more than the read itself."""
    declared = int(declared_length) if declared_length is not None and declared_length.isdigit() else None
    if declared is not None and declared > limit:
        raise BodyRefused(413, "body_too_large", f"request body exceeds {limit} bytes")
    held = [0]  # bytes held in the budget for this body so far
    held_in = budget
    try:
        if budget is not None and declared is not None and declared >= HOLD_DECLARED_FROM:
            _hold(budget, declared, held)
            budget = None  # held whole: nothing more to hold while it arrives
        if loss is not None and loss.body_received:
            return await _read_within(receive, limit, budget, held)
        async with asyncio.timeout(timeout_s):
            return await _read_within(receive, limit, budget, held)
    except TimeoutError:
        raise BodyRefused(408, "request_timeout", f"request body not received within {timeout_s:g} s") from None
    finally:
        if held[0] and held_in is not None:
            held_in.release_receiving(held[0])


def _hold(budget: ReceivingBudget, nbytes: int, held: list[int]) -> None:
    if not budget.hold_receiving(nbytes):
        raise BodyRefused(
            429,
            "queue_bytes_full",
            "the gateway holds too many bytes of requests waiting or arriving; retry later",
            retry_after_s=budget.retry_after(),
        )
    held[0] += nbytes


async def _read_within(receive: Receive, limit: int, budget: ReceivingBudget | None, held: list[int]) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise BodyRefused(413, "body_too_large", f"request body exceeds {limit} bytes")
        more = message.get("more_body", False)
        if budget is not None and (more or chunks):  # a body in one message is whole at once: nothing held
            _hold(budget, len(body), held)
        if not more:
            return b"".join([*chunks, body]) if chunks else body
        chunks.append(body)
