"""The JSON that vLLM's OpenAI server sends, field for field, built cheaply.

Streaming is the hot path (one SSE event per token per request), so a stream's constant part
is serialised once and each token only splices a word into it. Words come from a fixed ASCII
list, so no escaping is needed. Field order and presence follow vLLM's pydantic models as they
are serialised (``exclude_unset`` for chunks, full dumps for whole responses).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

DONE = "data: [DONE]\n\n"


def request_id(prefix: str, base: str | None = None) -> str:
    """vLLM's ids: ``<prefix>-<X-Request-Id of the request>``, or random hex when it sent none."""
    return f"{prefix}-{base or os.urandom(16).hex()}"


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's error shape (also OpenAI's): ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


class StreamFormat:
    """Pre-rendered pieces of one request's SSE stream (chat or text completion)."""

    __slots__ = ("chat", "head", "mid", "prefix", "tail", "usage_head")

    def __init__(self, *, chat: bool, model: str, created: int | None = None, base_id: str | None = None) -> None:
        self.chat = chat
        rid = request_id("chatcmpl" if chat else "cmpl", base_id)
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time()) if created is None else created
        self.head = f'{{"id":"{rid}","object":"{obj}","created":{created},"model":{json.dumps(model)},'
        if chat:
            self.prefix = "data: " + self.head + '"choices":[{"index":0,"delta":{"content":"'
            self.mid = '"},"logprobs":null,"finish_reason":'
            self.tail = "}]}"
        else:
            self.prefix = "data: " + self.head + '"choices":[{"index":0,"text":"'
            self.mid = '","logprobs":null,"finish_reason":'
            self.tail = ',"stop_reason":null}]}'
        self.usage_head = "data: " + self.head + '"choices":[],"usage":'

    def role_chunk(self) -> str:
        """The first chat chunk: the assistant role and empty content, before any token."""
        return (
            "data: " + self.head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def token(self, text: str, finish_reason: str | None = None, usage_json: str | None = None) -> str:
        """One token's event; the last one carries ``finish_reason`` (and vLLM's ``stop_reason``)."""
        if finish_reason is None:
            end = "null" + self.tail
        elif self.chat:
            end = f'"{finish_reason}","stop_reason":null}}]}}'
        else:
            end = f'"{finish_reason}"' + self.tail
        if usage_json is not None:
            end = end[:-1] + ',"usage":' + usage_json + "}"
        return self.prefix + text + self.mid + end + "\n\n"

    def finish_only(self, finish_reason: str) -> str:
        """A closing event with no text (a request that ended without producing its last token)."""
        return self.token("", finish_reason)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> str:
        return self.usage_head + json.dumps(usage(prompt_tokens, completion_tokens), separators=(",", ":")) + "}\n\n"


def chat_response(
    model: str, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int, base_id: str | None = None
) -> dict[str, Any]:
    return {
        "id": request_id("chatcmpl", base_id),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(prompt_tokens, completion_tokens) | {"prompt_tokens_details": None},
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def responses_response(
    model: str, text: str, finish_reason: str, input_tokens: int, output_tokens: int, previous_response_id: str | None
) -> dict[str, Any]:
    """A whole reply of the Responses API (``/v1/responses``), as vLLM serves it."""
    return {
        "id": request_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "completed" if finish_reason == "stop" else "incomplete",
        "incomplete_details": None if finish_reason == "stop" else {"reason": "max_output_tokens"},
        "previous_response_id": previous_response_id,
        "output": [
            {
                "id": request_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def completion_response(
    model: str, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int, base_id: str | None = None
) -> dict[str, Any]:
    return {
        "id": request_id("cmpl", base_id),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(prompt_tokens, completion_tokens) | {"prompt_tokens_details": None},
        "kv_transfer_params": None,
    }


def models_response(
    served_name: str,
    root: str,
    max_model_len: int,
    created: int,
    adapters: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """vLLM's model list: the base model, then each LoRA adapter as vLLM's ``show_available_models`` lists it
    (``id`` its name, ``root`` its path, ``parent`` the base model, no ``max_model_len``)."""
    base = _model_card(served_name, root, None, created)
    base["max_model_len"] = max_model_len
    cards = [base] + [_model_card(name, path, served_name, created) for name, path in adapters or []]
    return {"object": "list", "data": cards}


def _model_card(model_id: str, root: str, parent: str | None, created: int) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": None,
        "permission": [
            {
                "id": request_id("modelperm"),
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
