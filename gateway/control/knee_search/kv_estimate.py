"""The hard cap's KV term before any request has finished: estimated from the admitted requests' text.

``capacity.kv_cap`` counts the footprint of requests that finished, so until one has, the KV cache's cap is
unknown and the gateway admits up to its starting limit. With 24-31K-token prompts on a cache that holds three
of them, that is eight prompts the backend evicts and recomputes for a minute before the first one ends
(docs/controller.md, "The hard cap"). The gateway holds each request's body before it forwards it, so its
size can be estimated then: the prompt's characters over ``CHARS_PER_TOKEN``, plus its answer's
``max_tokens`` (``TYPICAL_ANSWER_TOKENS`` when it names none). Each is counted at its end, its whole prompt
and answer in the cache: nothing tells yet how far along the first requests are, and they are admitted
together. The cache holds the mean estimate's blocks that many times over (``kv_cap`` of an in-step
footprint); the caller (the gateway's request path, the scenario harness) asks before each admission, so the
first requests already meet the cap, not only the next control tick.

``CHARS_PER_TOKEN`` is 3.5, deliberately on the safe side: the common tokenizers read 3.7-4.5 characters a
token of English prose (Llama 3's and Mistral's; the simulator 4) and about 3 of code, so the estimate is
a little over the prompt's true size. Chinese or Japanese text runs 1-2 characters a token and is
underestimated: the cap is then higher than true, which is still no higher than having none. Either way the
estimate stands only until the first request finishes; from then on its measured footprint does
(``capacity.Footprint``). That is also why the ratio is a constant rather than learned from finished
requests' ``usage.prompt_tokens``: by the time one has finished, the estimate is no longer read.
"""

from __future__ import annotations

import math
from collections import deque

from gateway.control.knee_search.capacity import Footprint, kv_cap

# Characters of prompt text per token: under what the common tokenizers give for English (see above).
CHARS_PER_TOKEN = 3.5
# The answer a request that names no max_tokens is counted with (a chat's answer of a few paragraphs).
TYPICAL_ANSWER_TOKENS = 512
# The estimates the mean is taken over: the latest requests admitted.
ESTIMATES_KEPT = 64


def request_tokens(prompt_chars: int, max_tokens: int | None, *, prompt_ids: int | None = None) -> int:
    """The KV one request holds at its end, estimated before it runs: its prompt (``prompt_ids`` when it was
    given as token ids, else its text's ``prompt_chars`` over ``CHARS_PER_TOKEN``) and its answer."""
    prompt = prompt_ids if prompt_ids is not None else math.ceil(prompt_chars / CHARS_PER_TOKEN)
    answer = TYPICAL_ANSWER_TOKENS if max_tokens is None else max_tokens
    return max(prompt + answer, 1)


class PromptEstimates:
    """The estimated KV of the latest requests admitted to one upstream (``request_tokens``), as a footprint."""

    def __init__(self, keep: int = ESTIMATES_KEPT) -> None:
        self._tokens: deque[int] = deque(maxlen=keep)

    def __len__(self) -> int:
        return len(self._tokens)

    def note(self, tokens: int) -> None:
        self._tokens.append(max(tokens, 1))

    def footprint(self) -> Footprint | None:
        """Each request counted at its end (an in-step footprint); None before any request."""
        if not self._tokens:
            return None
        return Footprint(mean=sum(self._tokens) / len(self._tokens), sd=0.0, in_step=True, requests=len(self._tokens))


def admission_cap(
    limit: int, capacity_tokens: int | None, block_size: int | None, estimates: PromptEstimates
) -> int | None:
    """The limit a request about to be admitted meets: ``limit``, lowered to what the KV cache holds of the
    requests admitted so far (this one included); None when nothing lowers it (the cache's size or the
    estimates unknown, or the cap not under ``limit``)."""
    footprint = estimates.footprint()
    if not capacity_tokens or footprint is None:
        return None
    cap = kv_cap(capacity_tokens, block_size, footprint)
    return cap if cap < limit else None
