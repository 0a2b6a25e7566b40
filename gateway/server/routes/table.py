"""The generation routes the gateway admits and measures, and what each one's API looks like.

Every route here takes a permit from the upstream's limiter (they all use the same slots and KV cache),
feeds the same window and controller, and answers errors in its API's dialect. What differs is how a
stream is read (chat-style ``data:`` chunks, or named events), where the usage is, whether the gateway
must ask for it (chat and completions streams only report usage when asked), and whether a response is
remembered for later requests that refer to it (the Responses API's ``previous_response_id``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from gateway.server.relay.event_streams import (
    MESSAGES_EVENTS,
    RESPONSES_EVENTS,
    EventTable,
    messages_usage,
    openai_usage,
    responses_usage,
)
from gateway.server.routes.errors import Dialect
from gateway.server.routes.validation import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    MessagesRequest,
    RerankRequest,
    ResponsesRequest,
    ScoreRequest,
)

Usage = Callable[[dict[str, Any]], "dict[str, int] | None"]


@dataclass(frozen=True)
class Route:
    path: str
    schema: type[BaseModel]
    streams: bool
    dialect: Dialect = Dialect.OPENAI
    events: EventTable | None = None  # a stream of named events; None: chat-style data: chunks
    asks_usage: bool = False  # a stream reports usage only when asked (stream_options.include_usage)
    usage: Usage = openai_usage  # where a whole (not streamed) answer keeps its usage
    remembers_responses: bool = False  # later requests may name a response by id (previous_response_id)

    @property
    def named_events(self) -> bool:
        return self.events is not None


CHAT = Route("/v1/chat/completions", ChatRequest, True, asks_usage=True)
COMPLETIONS = Route("/v1/completions", CompletionRequest, True, asks_usage=True)
EMBEDDINGS = Route("/v1/embeddings", EmbeddingRequest, False)
RESPONSES = Route(
    "/v1/responses", ResponsesRequest, True, events=RESPONSES_EVENTS, usage=responses_usage, remembers_responses=True
)
MESSAGES = Route(
    "/v1/messages", MessagesRequest, True, dialect=Dialect.ANTHROPIC, events=MESSAGES_EVENTS, usage=messages_usage
)
RERANK = Route("/v1/rerank", RerankRequest, False)
SCORE = Route("/v1/score", ScoreRequest, False)

ROUTES = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, RERANK, SCORE)
PROXIED = {route.path: route for route in ROUTES}
