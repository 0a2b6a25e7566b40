"""A whole (not streamed) answer: read up to a byte bound, and the two fields the gateway needs from it.

A non-streamed answer can be large (``n=16`` with ``logprobs`` and ``top_logprobs=20`` over thousands of
tokens is a hundred megabytes of JSON), and several may arrive at once: it is read only up to
``max_response_bytes`` and refused past it, and its usage and id are read without building the answer as
Python objects (msgspec decodes into a struct of just those fields, skipping the rest as it scans).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec
from starlette.responses import Response

#: Bytes read from the upstream at a time while a whole answer is collected.
READ_CHUNK = 256 * 1024


class AnswerTooLarge(Exception):
    """The upstream's answer is over the gateway's bound: it is not read further."""


class _AnswerHead(msgspec.Struct):
    id: Any = None
    usage: Any = None


_DECODER = msgspec.json.Decoder(_AnswerHead)


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The answer's body, or :class:`AnswerTooLarge` as soon as it says, or turns out, to be over ``limit``."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise AnswerTooLarge(f"the upstream's answer is {declared} bytes, over the gateway's {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(READ_CHUNK):
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(f"the upstream's answer is over the gateway's {limit} bytes")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def answer_head(payload: bytes) -> dict[str, Any] | None:
    """``{"id", "usage"}`` of a JSON answer object (None when it is not one), the rest left unbuilt."""
    try:
        head = _DECODER.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return {"id": head.id, "usage": head.usage}


def whole_answer(payload: bytes, status: int, content_type: str) -> Response:
    """The client's response for an upstream's whole answer: its bytes, status and content type.

    Built with its header list in place rather than through ``Response.__init__``, which renders the body and
    looks up, encodes and sorts out the headers generically (about 1.6 us against 0.4 us, on every answer). The
    result is the response Starlette builds, but for a ``text/*`` type without a charset: it is passed on as the
    upstream sent it, where Starlette would append ``; charset=utf-8``."""
    response = Response.__new__(Response)
    response.status_code = status
    response.background = None
    response.body = payload
    response.raw_headers = [
        (b"content-length", str(len(payload)).encode()),
        (b"content-type", content_type.encode("latin-1")),
    ]
    return response
