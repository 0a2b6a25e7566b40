"""Request bodies of the OpenAI routes: their checks, and the one change the gateway makes to them.

The gateway validates only what it must understand (the model, the prompt, streaming and token
limits) and the types of common fields, so a mistyped request fails here with a clear 400 instead of
costing an upstream slot. Every other field passes through untouched: backends add their own
(``ignore_eos``, ``top_k``, ``chat_template_kwargs``, ...), and the original bytes are forwarded
whenever the gateway does not need to change them: only to ask for usage, and to name the served model when
an alias or the default model applies.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


_Number = StrictInt | StrictFloat


class _Common(BaseModel):
    # Fields not named here are forwarded in the original bytes, never read: not kept.
    model_config = ConfigDict(extra="ignore")

    model: StrictStr = Field(min_length=1)
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: StrictInt | None = Field(None, ge=0)
    n: StrictInt | None = Field(None, ge=1)
    temperature: _Number | None = None
    top_p: _Number | None = None
    user: StrictStr | None = None


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=0)


class CompletionRequest(_Common):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


def field_of(parsed: object, name: str) -> Any:
    """The field ``name`` of a parsed request body, or None where its API has no such field.

    Not ``getattr(parsed, name, None)``: pydantic answers a name its model lacks in ``__getattr__``, which
    formats and raises an ``AttributeError`` (about 4 us, against 0.1 for a field), and a request's path asks
    each body for fields that only other APIs have (a chat request's ``prompt``, ``previous_response_id``).
    Anything that is not a pydantic model is read with ``getattr``."""
    fields = getattr(type(parsed), "__pydantic_fields__", None)
    if fields is None:
        return getattr(parsed, name, None)
    return getattr(parsed, name) if name in fields else None


def has_field(parsed: object, name: str) -> bool:
    """Whether a parsed request body's API has the field ``name`` (``hasattr``, without the cost
    :func:`field_of` avoids)."""
    fields = getattr(type(parsed), "__pydantic_fields__", None)
    return hasattr(parsed, name) if fields is None else name in fields


def sequences(parsed: BaseModel) -> int:
    """How many sequences a request makes the backend run at once: ``n`` answers to each of its prompts (a
    completions ``prompt`` list is a batch). Each is a slot of the backend's batch and of its KV cache, so
    each holds a slot of the limit. Embeddings and the other routes run one."""
    n = field_of(parsed, "n") or 1
    prompt = field_of(parsed, "prompt")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return n * prompts


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr = Field(min_length=1)
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


class ResponsesRequest(BaseModel):
    """OpenAI's Responses API (``client.responses.create``)."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr = Field(min_length=1)
    input: StrictStr | list[dict[str, Any]]
    stream: StrictBool = False
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    previous_response_id: StrictStr | None = None
    temperature: _Number | None = None
    top_p: _Number | None = None
    user: StrictStr | None = None


class MessagesRequest(BaseModel):
    """Anthropic's Messages API (``anthropic.Anthropic().messages.create``): ``max_tokens`` is required there."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: StrictInt = Field(ge=1)
    stream: StrictBool = False
    system: StrictStr | list[dict[str, Any]] | None = None
    temperature: _Number | None = None
    top_p: _Number | None = None


class RerankRequest(BaseModel):
    """Rerank (vLLM, llama-server with ``--reranking``): a query against documents."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr = Field(min_length=1)
    query: StrictStr
    documents: list[StrictStr | dict[str, Any]] = Field(min_length=1)


class ScoreRequest(BaseModel):
    """vLLM's score API: pairs of texts scored by a cross-encoder."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr = Field(min_length=1)
    text_1: StrictStr | list[StrictStr]
    text_2: StrictStr | list[StrictStr]


class ModelOnly(BaseModel):
    """A light request (tokenize, count_tokens): only the model, if any, is read, to pick an upstream."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None


def parse_body(schema: type[BaseModel], body: bytes) -> BaseModel:
    """The validated request, parsed from the raw body in one pass (pydantic's own JSON parser: no
    intermediate dict, and several times cheaper than ``json.loads`` plus validation). Anything wrong
    becomes a :class:`BadRequest` naming the first problem."""
    if not body.strip():
        raise BadRequest("request body is empty; expected a JSON object", code="invalid_json")
    try:
        return schema.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = first["loc"]
        if not loc and first["type"] == "json_invalid":
            raise BadRequest(f"request body is not valid JSON: {first['ctx']['error']}", code="invalid_json") from None
        if not loc and first["type"] == "model_type":
            raise BadRequest("request body must be a JSON object", code="invalid_json") from None
        param = ".".join(str(part) for part in loc) or None
        raise BadRequest(f"{param}: {first['msg']}" if param else first["msg"], param=param) from None


def with_usage_requested(body: bytes, options: dict | None) -> bytes:
    """The request body asking the upstream for ``stream_options.include_usage``.

    The common case, a body without ``stream_options``, gets the field spliced in before its closing
    brace, so every other byte goes upstream as the client sent it (and nothing is re-serialised);
    a body that has the field is rewritten through ``json``.
    """
    if options is None and b'"stream_options"' not in body:
        end = body.rindex(b"}")  # validated as a non-empty JSON object: its last brace closes it
        return body[:end] + b',"stream_options":{"include_usage":true}' + body[end:]
    data = json.loads(body)
    data["stream_options"] = {**(options or {}), "include_usage": True}
    return json.dumps(data).encode()


def with_model(body: bytes, served: str) -> bytes:
    """The request body naming ``served`` as its model (an alias or the default model applied). Re-serialised
    through ``json``, which only these requests pay: a name the client chose may also appear anywhere else in
    the body (a message, a tool), so no byte splice could tell the top-level field from the others."""
    data = json.loads(body)
    data["model"] = served
    return json.dumps(data, separators=(",", ":")).encode()


def model_not_found(model: str, served: str) -> str:
    """The 404's message for a name nobody serves (naming the served name when an alias or the default applied)."""
    if served == model:
        return f"the model `{model}` does not exist on any upstream"
    return f"the model `{model}` (served as `{served}`) does not exist on any upstream"
