"""Parse OpenAI request bodies the way vLLM does: lenient about extras, strict about sizes.

Unknown fields (``top_k``, ``ignore_eos`` on chat, ``seed``, ``temperature``...) are accepted and
ignored, as vLLM accepts them. What would make vLLM answer 400 answers 400 here, with vLLM's
error type and a message a client can act on.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from gateway.sim import text


class BadRequest(Exception):
    """A request vLLM would refuse; ``status`` is the HTTP code (400, or 404 for an unknown model)."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status

    @property
    def err_type(self) -> str:
        return "NotFoundError" if self.status == 404 else "BadRequestError"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    chat: bool
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool
    seed: int  # text seed: same prompt, same words
    prompt_ids: list[int]  # the prompt's token ids (gateway.sim.text), what prefix caching hashes
    lora: str | None = None  # the LoRA adapter the request names; None: the base model


def check_model(body: dict[str, Any], served: str, adapters: Container[str] = ()) -> str | None:
    """The adapter a body's ``model`` names (None: the base model, or no model given); 404 for any other name."""
    model = body.get("model")
    if model is None or model == served:
        return None
    if isinstance(model, str) and model in adapters:
        return model
    raise BadRequest(f"The model `{model}` does not exist.", param="model", status=404)


def parse_generation(
    body: Any, *, chat: bool, served_model: str, max_model_len: int, adapters: Container[str] = ()
) -> GenerationRequest:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    lora = check_model(body, served_model, adapters)
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("'messages' must be a non-empty list of message objects", param="messages")
        try:
            prompt_tokens, seed = text.chat_prompt_tokens(messages)
            prompt_ids = text.chat_token_ids(messages)
        except TypeError as exc:
            raise BadRequest(str(exc), param="messages") from None
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            prompt_tokens, seed = text.completion_prompt_tokens(prompt)
            prompt_ids = text.text_token_ids(prompt) if isinstance(prompt, str) else list(prompt)
        else:
            raise BadRequest(
                "'prompt' must be a string or a non-empty list of token ids "
                "(batches of several prompts are not supported)",
                param="prompt",
            )
    n = body.get("n", 1)
    if n not in (None, 1):
        raise BadRequest("the simulator supports only n=1", param="n")
    max_tokens = body.get("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = max_model_len - prompt_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest("max_tokens must be an integer >= 1", param="max_tokens")
    if prompt_tokens + max_tokens > max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            f"completion). Please reduce the length of the messages or completion.",
            param="max_tokens",
        )
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest("'stream_options' must be an object", param="stream_options")
    if opts and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.", param="stream_options")
    return GenerationRequest(
        chat=chat,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(opts.get("include_usage")),
        continuous_usage=bool(opts.get("continuous_usage_stats")),
        ignore_eos=bool(body.get("ignore_eos")),
        seed=seed,
        prompt_ids=prompt_ids,
        lora=lora,
    )


def parse_embedding_inputs(body: Any, served_model: str) -> tuple[list[str], str]:
    """(texts, encoding format) of an embeddings request; token-id inputs become their repr."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    check_model(body, served_model)
    raw = body.get("input")
    if isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
        inputs = [repr(raw)]
    elif isinstance(raw, list) and raw and all(isinstance(x, (str, list)) for x in raw):
        inputs = [x if isinstance(x, str) else repr(x) for x in raw]
    else:
        raise BadRequest("'input' must be a string, a list of strings or token ids", param="input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise BadRequest("encoding_format must be 'float' or 'base64'", param="encoding_format")
    return inputs, fmt
