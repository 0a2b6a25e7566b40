"""The KV cache's hard cap before any request has finished: each request's KV estimated from its body, the
cap those estimates give (at admission and in the control tick's observation), and the measured footprint
taking over once a request has finished."""

from __future__ import annotations

import math

from gateway.control.knee_search.capacity import kv_cap
from gateway.control.knee_search.kv_estimate import (
    CHARS_PER_TOKEN,
    TYPICAL_ANSWER_TOKENS,
    PromptEstimates,
    admission_cap,
    request_tokens,
)
from gateway.control.window import Outcome, RequestSample, SlidingWindow
from gateway.server.admission.limiter import Limiter
from gateway.server.admission.prompt_size import estimated_kv_tokens
from gateway.server.feedback.control_loop import ControlLoop
from gateway.server.feedback.hard_cap import hard_cap, kv_size
from gateway.server.parts import Gateway
from gateway.server.routes.validation import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    MessagesRequest,
    ResponsesRequest,
)
from gateway.server.upstream.pool import Upstream
from gateway.settings import Settings
from gateway.telemetry.backends import BackendSnapshot

# The simulator's RAG deployment (docs/controller.md, the matrix): Mistral-7B on a 24 GB card publishes 6,749
# blocks of 16 tokens, and its requests are 24-31K-token prompts with answers of 128-512 tokens.
RAG_BLOCKS, BLOCK = 6749, 16
RAG = BackendSnapshot(kind="vllm", kv_capacity_tokens=RAG_BLOCKS * BLOCK, kv_block_size=BLOCK)


def rag_chat(prompt_tokens: int, max_tokens: int | None = 320) -> ChatRequest:
    """A RAG request of ``prompt_tokens`` tokens of English-like text (4 characters a token)."""
    text = "word " * (prompt_tokens * 4 // 5)
    return ChatRequest(model="m", messages=[{"role": "user", "content": text}], max_tokens=max_tokens)


def upstream(limit: int = 8, *, holds_kv_cap: bool = True, size: tuple[int, int | None] | None = None) -> Upstream:
    found = Upstream("http://a", Limiter("http://a", limit), SlidingWindow(60.0))
    found.holds_kv_cap = holds_kv_cap
    found.kv_size = size
    return found


def finished(prompt: int, output: int, at: float = 1.0) -> RequestSample:
    return RequestSample(
        arrived=0.0,
        admitted=0.0,
        finished=at,
        first_token=0.1,
        prompt_tokens=prompt,
        output_tokens=output,
        outcome=Outcome.OK,
    )


def test_a_request_is_its_texts_characters_over_the_ratio_plus_its_answer_limit() -> None:
    assert CHARS_PER_TOKEN < 4  # over what English text takes on the common tokenizers: on the safe side
    assert request_tokens(7000, 300) == 2000 + 300
    assert request_tokens(7001, 300) == 2001 + 300  # rounded up
    assert request_tokens(7000, None) == 2000 + TYPICAL_ANSWER_TOKENS
    assert request_tokens(10**9, 5, prompt_ids=100) == 105  # token ids are counted, not estimated
    assert request_tokens(0, 0) == 1


def test_the_body_gives_the_prompt_text_and_the_answer_limit_of_every_generating_route() -> None:
    chat = rag_chat(28_000, max_tokens=256)
    text_chars = len(chat.messages[0]["content"]) + len("\x1euser\x1f")  # the router's prompt text
    assert estimated_kv_tokens(chat) == math.ceil(text_chars / CHARS_PER_TOKEN) + 256
    # A 28K-token prompt is estimated over its size, not under it (4 characters a token against 3.5).
    assert 28_000 + 256 < estimated_kv_tokens(chat) < 1.2 * 28_000 + 256  # type: ignore[operator]
    newer = ChatRequest(model="m", messages=[{"role": "user", "content": "x" * 35}], max_completion_tokens=9)
    assert estimated_kv_tokens(newer) == math.ceil((35 + 6) / CHARS_PER_TOKEN) + 9
    no_limit = ChatRequest(model="m", messages=[{"role": "user", "content": "x" * 29}])
    assert estimated_kv_tokens(no_limit) == 10 + TYPICAL_ANSWER_TOKENS
    ids = CompletionRequest(model="m", prompt=list(range(500)), max_tokens=20)
    assert estimated_kv_tokens(ids) == 520
    batch = CompletionRequest(model="m", prompt=[[1] * 100, [2] * 300], max_tokens=20)
    assert estimated_kv_tokens(batch) == 200 + 20  # per sequence, as each holds a slot of the limit
    texts = CompletionRequest(model="m", prompt=["y" * 70, "z" * 140], max_tokens=10)
    assert estimated_kv_tokens(texts) == 30 + 10
    messages = MessagesRequest(model="m", system="s" * 100, messages=[{"role": "user", "content": "q"}], max_tokens=50)
    assert estimated_kv_tokens(messages) > 100 / CHARS_PER_TOKEN + 50  # the system prompt counts
    responses = ResponsesRequest(model="m", input="r" * 350, max_output_tokens=40)
    assert estimated_kv_tokens(responses) == math.ceil((350 + 6) / CHARS_PER_TOKEN) + 40
    assert estimated_kv_tokens(EmbeddingRequest(model="m", input="holds no KV past its own prefill")) is None


def test_the_estimates_cap_is_what_the_published_cache_holds_of_the_admitted_requests_at_their_end() -> None:
    estimates = PromptEstimates()
    assert estimates.footprint() is None
    assert admission_cap(8, RAG_BLOCKS * BLOCK, BLOCK, estimates) is None  # nothing admitted: nothing to count
    for prompt in (24_000, 31_000, 27_500):
        estimates.note(estimated_kv_tokens(rag_chat(prompt)))  # type: ignore[arg-type]
    footprint = estimates.footprint()
    assert footprint is not None and footprint.in_step and footprint.sd == 0 and footprint.requests == 3
    # Three of these fit in 6,749 blocks (the cap the matrix's best static limit and the measured footprint say).
    assert admission_cap(8, RAG_BLOCKS * BLOCK, BLOCK, estimates) == 3
    assert admission_cap(3, RAG_BLOCKS * BLOCK, BLOCK, estimates) is None  # only ever lowers the limit
    assert admission_cap(8, None, BLOCK, estimates) is None  # no published size (llama-server): nothing
    # The cap counts whole blocks of the mean estimate, as kv_cap does for requests in step.
    per_request = math.ceil(footprint.mean / BLOCK)
    assert (RAG_BLOCKS - 1) // per_request == 3 == kv_cap(RAG_BLOCKS * BLOCK, BLOCK, footprint)
    # The mean follows the latest requests only.
    recent = PromptEstimates(keep=2)
    for tokens in (100_000, 1_000, 1_000):
        recent.note(tokens)
    assert recent.footprint().mean == 1_000  # type: ignore[union-attr]


def test_a_long_prompt_lowers_the_limit_before_it_is_admitted() -> None:
    """The first RAG request meets the cap on the request path, before any control tick: with the published
    cache of three such requests the starting limit of 8 comes down to 3 at once."""
    up = upstream(8, size=(RAG_BLOCKS * BLOCK, BLOCK))
    up.admitting(estimated_kv_tokens(rag_chat(28_000)))  # type: ignore[arg-type]
    assert up.limiter.limit == 3
    up.admitting(estimated_kv_tokens(rag_chat(300)))  # type: ignore[arg-type]
    assert up.limiter.limit == 3  # never raised on the request path: the control tick does that
    # A baseline algorithm (or a fixed limit) reads no hard cap: its limit stays where it is.
    baseline = upstream(8, holds_kv_cap=False, size=(RAG_BLOCKS * BLOCK, BLOCK))
    baseline.admitting(estimated_kv_tokens(rag_chat(28_000)))  # type: ignore[arg-type]
    assert baseline.limiter.limit == 8
    # llama-server publishes no KV size: no cap, whatever the prompt.
    llama = upstream(8, size=kv_size(BackendSnapshot(kind="llamacpp", total_slots=4), None))
    assert llama.kv_size is None
    llama.admitting(estimated_kv_tokens(rag_chat(28_000)))  # type: ignore[arg-type]
    assert llama.limiter.limit == 8


def test_the_hard_cap_counts_the_estimates_until_a_request_has_finished_then_its_measured_footprint() -> None:
    up = upstream(8, size=(RAG_BLOCKS * BLOCK, BLOCK))
    assert hard_cap(RAG, up, None, None, now=1.0) is None  # nothing admitted, nothing measured
    for prompt in (24_000, 31_000, 27_500):
        up.admitting(estimated_kv_tokens(rag_chat(prompt)))  # type: ignore[arg-type]
    assert hard_cap(RAG, up, None, None, now=2.0) == 3  # the control tick's observation: the same cap
    # One request finished: its measured footprint (12K tokens held) stands, and the estimates no longer count.
    up.window.add(finished(prompt=11_900, output=100, at=3.0))
    assert hard_cap(RAG, up, None, None, now=4.0) == kv_cap(RAG_BLOCKS * BLOCK, BLOCK, up.request_footprint(4.0))  # type: ignore[arg-type]
    assert hard_cap(RAG, up, None, None, now=4.0) == 8
    up.limiter.set_limit(8)  # as the control tick sets it from that cap
    up.admitting(estimated_kv_tokens(rag_chat(31_000)))  # type: ignore[arg-type]
    assert len(up.kv_estimates) == 3 and up.limiter.limit == 8  # the request path no longer estimates


def test_the_kv_size_is_the_published_one_else_the_planned_one() -> None:
    assert kv_size(RAG, 1_000) == (RAG_BLOCKS * BLOCK, BLOCK)
    assert kv_size(BackendSnapshot(kind="vllm"), 50_000) == (50_000, None)
    assert kv_size(BackendSnapshot(kind="llamacpp", total_slots=4), None) is None


def test_only_the_built_in_controller_holds_the_cap_at_admission() -> None:
    """A baseline algorithm reads no hard cap (its limit would be the request path's, not its own), and with
    control off the limit is the operator's: neither is lowered before admission."""
    url = "http://127.0.0.1:9"
    for extra, holds in (({}, True), ({"algorithm": "gateway.control.baselines.threshold:ThresholdGate"}, False)):
        gateway = Gateway.build(Settings(upstreams=[url], **extra))
        ControlLoop.build(gateway)
        assert gateway.pool.by_name[url].holds_kv_cap is holds
    gateway = Gateway.build(Settings(upstreams=[url], control_enabled=False))
    ControlLoop.build(gateway)
    assert gateway.pool.by_name[url].holds_kv_cap is False


class _Scraper:
    """What ``ControlLoop.scrape`` asks of a scraper: its backend's kind and a snapshot."""

    def __init__(self, snapshot: BackendSnapshot) -> None:
        self.kind = snapshot.kind
        self.snapshot = snapshot

    async def scrape(self) -> BackendSnapshot:
        return self.snapshot


async def test_requests_are_estimated_only_where_a_control_tick_reads_a_kv_size() -> None:
    """Estimating a request's KV costs the request path a walk over its prompt: it is done only while a
    control tick may read the estimates against a KV cache's size. Control off, or a backend that reports no
    KV cache (llama-server), skips it; a failed scrape changes nothing, and a size reported later resumes it."""
    url = "http://127.0.0.1:9"
    gateway = Gateway.build(Settings(upstreams=[url], control_enabled=False))
    ControlLoop.build(gateway)
    assert not gateway.pool.by_name[url].estimating_kv
    gateway = Gateway.build(Settings(upstreams=[url]))
    loop = ControlLoop.build(gateway)
    up = gateway.pool.by_name[url]
    assert up.estimating_kv  # nothing scraped yet: a vLLM's size may come with the first scrape
    for snapshot, estimating in (
        (BackendSnapshot(kind="llamacpp", total_slots=4), False),
        (BackendSnapshot(kind="llamacpp", error="connection refused"), False),  # a failed scrape keeps it
        (RAG, True),
        (BackendSnapshot(kind="vllm", error="timed out"), True),
    ):
        loop.scrapers[url] = _Scraper(snapshot)  # type: ignore[assignment]
        await loop.scrape()
        assert up.estimating_kv is estimating, snapshot
    up.window.add(finished(prompt=11_900, output=100, at=3.0))
    up.request_footprint(4.0)
    assert not up.estimating_kv  # measured: the estimates no longer count
