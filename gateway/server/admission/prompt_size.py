"""How much KV cache a request will hold, estimated from its body before it is forwarded.

The gateway reads no tokenizer: the prompt's text as the router reads it (``routing.prompt_text``: the
messages' roles and contents, the completion's prompt, the Responses API's input) is counted in characters,
and ``gateway.control.knee_search.kv_estimate.request_tokens`` turns that and the answer's token limit into
tokens. A prompt given as token ids is counted exactly. Each sequence of a batch (a completions ``prompt``
list) is one request's worth: the estimate is per sequence, as the limit's slots are.
"""

from __future__ import annotations

from typing import Any

from gateway.control.knee_search.kv_estimate import request_tokens
from gateway.server.admission.routing import prompt_text
from gateway.server.routes.validation import field_of


def estimated_kv_tokens(parsed: Any) -> int | None:
    """The KV one sequence of ``parsed`` holds at its end, estimated; None for a request that holds no KV past
    its own prefill (an embedding, a rerank, a score) or whose prompt the gateway cannot read."""
    answer = _answer_limit(parsed)
    prompt = field_of(parsed, "prompt")
    if isinstance(prompt, list) and prompt:
        if all(isinstance(i, int) for i in prompt):
            return request_tokens(0, answer, prompt_ids=len(prompt))
        if all(isinstance(p, list) for p in prompt):
            return request_tokens(0, answer, prompt_ids=max(1, sum(len(p) for p in prompt) // len(prompt)))
        if all(isinstance(p, str) for p in prompt):
            return request_tokens(sum(len(p) for p in prompt) // len(prompt), answer)
    text = prompt_text(parsed)
    if text is None:
        return None
    return request_tokens(len(text), answer)


def _answer_limit(parsed: Any) -> int | None:
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = field_of(parsed, name)
        if isinstance(value, int):
            return value
    return None
