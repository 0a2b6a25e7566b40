"""A simulator route's JSON body, or the 400 vLLM answers for one that is not JSON (or not an object)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from gateway.sim.protocol import BadRequest


async def read_json(request: Request) -> Any:
    """The request's body parsed as JSON; 400 when it is not JSON."""
    try:
        return await request.json()
    except ValueError:
        raise BadRequest("request body is not valid JSON") from None


async def read_json_object(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object; 400 when it is not JSON or not an object."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body
