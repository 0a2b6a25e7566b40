"""Prefix-aware routing: the prompt's chunk keys, the bounded expiring map, and affinity weighed against load."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.server.admission.admission_queue import AdmissionQueue
from gateway.server.admission.limiter import Limiter
from gateway.server.admission.routing import (
    CHUNK_CHARS,
    REASON_LOAD,
    REASON_NO_PREFIX,
    REASON_PREFIX,
    PrefixMap,
    PrefixRouter,
    RouteHint,
    RouteObserver,
    chunk_keys,
    prompt_text,
)
from gateway.server.routes.validation import (
    ChatRequest,
    CompletionRequest,
    MessagesRequest,
    ResponsesRequest,
    parse_body,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Target:
    name: str
    limiter: Limiter
    healthy: bool = True


class Recorder(RouteObserver):
    def __init__(self) -> None:
        self.decisions: list[tuple[str, str, int, int]] = []

    def decided(self, reason: str, upstream: str, chunks: int, hit_chunks: int) -> None:
        self.decisions.append((reason, upstream, chunks, hit_chunks))


SYSTEM = "You are a careful assistant. " * 40  # ~1,160 characters: four full chunks


def chat(*turns: str) -> ChatRequest:
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return ChatRequest(model="m", messages=messages)


def make_router(clock: FakeClock | None = None, **kw: float) -> tuple[PrefixRouter, Recorder]:
    recorder = Recorder()
    prefixes = PrefixMap(
        max_entries=int(kw.pop("max_entries", 10_000)), ttl_s=kw.pop("ttl_s", 60.0), clock=clock or FakeClock()
    )
    return PrefixRouter(prefixes, observer=recorder, **kw), recorder


def ups(*names: str, limit: int = 8) -> list[Target]:
    return [Target(n, Limiter(n, limit)) for n in names]


def test_chunk_keys_are_chained_over_full_chunks() -> None:
    text = "x" * (3 * CHUNK_CHARS + 10)
    keys = chunk_keys(text)
    assert len(keys) == 3 and len(set(keys)) == 3  # equal chunks, different keys: each names its whole prefix
    assert chunk_keys(text[: 2 * CHUNK_CHARS]) == keys[:2]
    assert not set(chunk_keys("y" + text[1:])) & set(keys)
    assert len(chunk_keys("z" * 10 * CHUNK_CHARS, max_chunks=4)) == 4


def test_prompt_text_of_every_generating_route() -> None:
    first = prompt_text(chat("hello"))
    second = prompt_text(chat("hello", "hi there", "and now?"))
    assert first is not None and second is not None and second.startswith(first)
    assert prompt_text(parse_body(CompletionRequest, b'{"model": "m", "prompt": "abc"}')) == "abc"
    assert prompt_text(parse_body(CompletionRequest, b'{"model": "m", "prompt": [1, 2]}')) == "[1, 2]"
    messages = parse_body(
        MessagesRequest,
        b'{"model": "m", "max_tokens": 5, "system": "S", '
        b'"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]}',
    )
    assert prompt_text(messages) == "\x1esystem\x1fS\x1euser\x1fq"
    responses = parse_body(ResponsesRequest, b'{"model": "m", "input": "question"}')
    assert prompt_text(responses) == "\x1euser\x1fquestion"
    assert prompt_text(object()) is None  # embeddings and the like: nothing to route on


def test_a_conversation_returns_to_the_upstream_that_served_its_previous_turn() -> None:
    router, seen = make_router()
    targets = ups("a", "b", "c")
    first = router.choose(targets, router.hint(chat("tell me about " + "tides " * 200)))
    first.limiter.acquire()  # it is still running: the others are less loaded
    follow_up = router.hint(chat("tell me about " + "tides " * 200, "Tides are ... " * 50, "and the moon?"))
    assert router.choose(targets, follow_up) is first
    reason, upstream, chunks, hit = seen.decisions[-1]
    assert reason == REASON_PREFIX and upstream == first.name and 0 < hit < chunks
    assert seen.decisions[0][0] == REASON_NO_PREFIX


def test_without_a_known_prefix_it_is_least_loaded() -> None:
    router, seen = make_router()
    a, b = targets = ups("a", "b")
    a.limiter.acquire()
    assert router.choose(targets, RouteHint(())) is b  # a prompt shorter than a chunk
    assert router.choose(targets, router.hint(chat("x" * 2000))) is b
    assert [d[0] for d in seen.decisions] == [REASON_NO_PREFIX, REASON_NO_PREFIX]


def test_new_prompts_spread_over_idle_upstreams_and_stay_where_they_went() -> None:
    router, _ = make_router()
    targets = ups("a", "b")
    conversations = [f"conversation {i} " * 100 for i in range(2)]
    first = [
        router.choose(targets, router.hint(ChatRequest(model="m", messages=[{"role": "user", "content": c}])))
        for c in conversations
    ]
    assert [t.name for t in first] == ["a", "b"]  # all idle: the one chosen least recently
    for _ in range(3):  # sequential turns, every upstream idle each time: each goes back to its own
        for c, where in zip(conversations, first, strict=True):
            body = ChatRequest(
                model="m", messages=[{"role": "user", "content": c}, {"role": "assistant", "content": "ok"}]
            )
            assert router.choose(targets, router.hint(body)) is where


def test_load_outweighs_a_small_shared_prefix_but_not_a_long_history() -> None:
    router, seen = make_router()
    a, b = targets = ups("a", "b", limit=10)
    history = "long history " * 400  # ~5,200 characters
    assert router.choose([a], router.hint(chat(history))) is a
    for _ in range(6):
        a.limiter.acquire()  # a is 60 % busy, b idle
    # a new conversation shares only the system prompt with what a holds: 4 of ~24 chunks, not worth 0.6 load
    assert router.choose(targets, router.hint(chat("an unrelated question " * 200))) is b
    assert seen.decisions[-1][0] == REASON_LOAD
    # the same conversation's next turn: nearly all of it is cached on a, worth more than the load
    assert router.choose(targets, router.hint(chat(history, "answer", "next"))) is a
    assert seen.decisions[-1][0] == REASON_PREFIX


def test_the_map_is_bounded_and_expires() -> None:
    clock = FakeClock()
    prefixes = PrefixMap(max_entries=50, ttl_s=10.0, clock=clock)
    prefixes.record(range(40), "a")
    assert prefixes.matches(range(40)) == {"a": 40}
    prefixes.record(range(100, 140), "b")
    assert len(prefixes) == 50  # the least recently written went first
    assert prefixes.matches(range(40)) == {}
    assert prefixes.matches(range(100, 140)) == {"b": 40}
    clock.now += 11
    assert prefixes.matches(range(100, 140)) == {}  # expired: an upstream's cache forgets too
    prefixes.record([7], "a")  # a write prunes the expired entries
    assert len(prefixes) == 1


def test_a_prefix_held_by_several_upstreams_matches_each_as_far_as_it_goes() -> None:
    prefixes = PrefixMap(max_entries=100, ttl_s=10.0, clock=FakeClock())
    prefixes.record([1, 2, 3, 4], "a")
    prefixes.record([1, 2, 9], "b")
    assert prefixes.matches([1, 2, 3, 4, 5]) == {"a": 4, "b": 2}
    prefixes.forget("a")
    assert prefixes.matches([1, 2, 3, 4, 5]) == {"b": 2}


async def test_the_queue_never_sends_affinity_to_a_saturated_upstream_while_another_has_room() -> None:
    router, seen = make_router()
    a, b = ups("a", "b", limit=1)
    queue: AdmissionQueue[Target] = AdmissionQueue([a, b], max_queue=10, clock=FakeClock(), choose=router.choose)
    hint = router.hint(chat("history " * 300))
    first = await queue.acquire(timeout_s=1, hint=hint)
    # the same prefix again: its upstream is full, so it goes to the other one at once rather than wait
    second = await queue.acquire(timeout_s=1, hint=hint)
    assert {first.target.name, second.target.name} == {"a", "b"}
    assert seen.decisions[-1][0] == REASON_LOAD
    # both full: it waits, and takes whichever frees first
    waiting = asyncio.create_task(queue.acquire(timeout_s=5, hint=hint))
    await asyncio.sleep(0)
    assert queue.depth == 1
    queue.release(second)
    third = await waiting
    assert third.target is second.target


async def test_a_queued_request_is_placed_by_its_hint_when_several_free_up() -> None:
    router, _ = make_router()
    a, b = ups("a", "b", limit=1)
    queue: AdmissionQueue[Target] = AdmissionQueue([a, b], max_queue=10, clock=FakeClock(), choose=router.choose)
    router.prefixes.record(router.hint(chat("on b " * 300)).keys, "b")
    pa = await queue.acquire(timeout_s=1)
    pb = await queue.acquire(timeout_s=1)
    waiting = asyncio.create_task(queue.acquire(timeout_s=5, hint=router.hint(chat("on b " * 300, "more"))))
    await asyncio.sleep(0)
    a.limiter.release()  # free both before the queue looks (as a raised limit would), then dispatch once
    b.limiter.release()
    pa.released = pb.released = True
    queue.dispatch()
    assert (await waiting).target is b


def test_the_gateway_routes_by_prefix_only_when_there_is_a_choice() -> None:
    from gateway.server.parts import Gateway
    from gateway.settings import Settings

    two = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    built = Gateway.build(Settings(upstreams=two))
    assert isinstance(built.router, PrefixRouter) and built.queue.choose == built.router.choose
    assert Gateway.build(Settings(upstreams=two[:1])).router is None  # nothing to choose, nothing hashed
    least = Gateway.build(Settings(upstreams=two, routing="least_loaded"))
    assert least.router is None and least.queue.choose is None
    bounded = Gateway.build(Settings(upstreams=two, routing_prefix_map_max=3))
    assert bounded.router is not None
    bounded.router.choose(list(bounded.pool), bounded.router.hint(chat("a long prompt " * 200)))
    assert len(bounded.router.prefixes) == 3
    assert bounded.metrics.registry.get_sample_value("sweetspot_routing_prefix_map_entries") == 3
    assert (
        bounded.metrics.registry.get_sample_value("sweetspot_routing_decisions_total", {"reason": REASON_NO_PREFIX})
        == 1
    )


def test_the_random_baseline_ignores_affinity_but_counts_what_it_hits() -> None:
    from gateway.server.admission.routing import REASON_RANDOM, RandomRouter

    recorder = Recorder()
    router = RandomRouter(PrefixMap(max_entries=1000, ttl_s=60.0, clock=FakeClock()), seed=1, observer=recorder)
    targets = ups("a", "b", "c", "d")
    hint = router.hint(chat("the same conversation " * 100))
    chosen = {router.choose(targets, hint).name for _ in range(40)}
    assert len(chosen) > 2  # affinity would have kept it on one upstream
    assert {d[0] for d in recorder.decisions} == {REASON_RANDOM}
    assert any(hit == chunks for _, _, chunks, hit in recorder.decisions)  # landing where it was: a full hit
    assert any(hit == 0 for _, _, _, hit in recorder.decisions[1:]) or len(chosen) == 4
