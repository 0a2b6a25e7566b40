"""Which upstream a request goes to when several could serve it: prefix affinity weighed against load.

A chat or an agent resends its whole history every turn. The upstream that served the previous turn still
holds that history's KV cache (vLLM's automatic prefix caching, llama-server's per-slot prompt cache), so
there the prompt's prefill is mostly skipped; anywhere else it is recomputed, and at long contexts prefill is
most of the time to first token. So the gateway remembers, per *prefix*, which upstreams served it recently,
and prefers the one that holds the longest prefix of a new request, unless that upstream is busier than the
saving is worth.

No tokenizer: the prompt's text as the client sent it (roles and contents of the messages, or the prompt) is
cut into fixed-size chunks, each chunk's key chained over the key before it, so one key stands for the whole
prefix up to the end of its chunk, as vLLM's block hashes do. Two requests share a leading run of keys exactly
when they share a leading run of text, which is when a backend's prefix cache can serve the second.

The map from keys to upstreams is bounded (least recently used keys go first) and its entries expire, since
a backend's cache forgets too; it is pruned on the request path, so memory stays flat under any load. It
keeps, per key, every upstream that served it recently rather than only the last: a system prompt shared by
every conversation is cached on every upstream, and remembering only the latest would make it look absent
where it is not.

The choice is made among the upstreams that can take the request *now* (healthy, a free permit under their
adaptive limit), so affinity never sends work to a saturated upstream while another has room. Score:
``matched share of the prompt's chunks - load_weight x (in-flight / limit)``; ties go to the most free
permits, then to the upstream chosen least recently, so new prompts spread over the upstreams' caches instead
of all landing on the first idle one and evicting each other there. With no prefix known anywhere it is
least-loaded routing with that tie-break.

A request for a LoRA adapter adds the adapter's affinity to the score (:mod:`gateway.server.admission.lora_affinity`:
``+weight`` where the adapter runs, half where it ran recently, ``-swap_penalty`` where ``max_lora`` other
adapters run), under the same rule: only upstreams with room are candidates, so the queue's order is untouched.
"""

from __future__ import annotations

import json
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.server.admission.admission_queue import AdmissionTarget
from gateway.server.admission.lora_affinity import AdapterAffinity
from gateway.server.routes.validation import field_of, has_field
from gateway.telemetry.metrics import GatewayMetrics

#: Characters per chunk: about 64 tokens of English, fine enough that a turn's new text is a few chunks, coarse
#: enough that a long history costs a few hundred dictionary lookups.
CHUNK_CHARS = 256
#: Chunks hashed per request (the first 512 KiB of prompt text); beyond, a prefix is long enough to tell.
MAX_CHUNKS = 2048

#: Why an upstream was chosen (the ``reason`` label of ``sweetspot_routing_decisions_total``).
REASON_PREFIX = "prefix"  # the chosen upstream holds the longest known prefix of the request
REASON_LOAD = "load"  # another upstream holds a longer prefix but is full, or busier than the saving is worth
REASON_NO_PREFIX = "least_loaded"  # no upstream is known to hold any of it: the least loaded one
REASON_RANDOM = "random"  # the random policy, a baseline for benchmarks
REASONS = (REASON_PREFIX, REASON_LOAD, REASON_NO_PREFIX, REASON_RANDOM)

T = TypeVar("T", bound=AdmissionTarget)


def prompt_text(body: Any) -> str | None:
    """The prompt as the client wrote it, from a parsed request body: the messages (role and content, with
    the Messages API's ``system`` first), the completion's prompt or the Responses API's input; None for
    anything else (an embedding, a rerank), whose prompt no backend caches across requests."""
    parts: list[str] = []
    system = field_of(body, "system")
    if system is not None:
        parts.append("\x1esystem\x1f" + _content_text(system))
    messages = field_of(body, "messages")
    if messages is None and has_field(body, "input") and has_field(body, "previous_response_id"):
        given = body.input
        messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
    if messages is not None:
        for message in messages:
            parts.append(f"\x1e{message.get('role', '')}\x1f" + _content_text(message.get("content")))
            calls = message.get("tool_calls")
            if calls:
                parts.append(json.dumps(calls, sort_keys=True))
        return "".join(parts)
    prompt = field_of(body, "prompt")
    if prompt is None:
        return None
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str) else json.dumps(p, sort_keys=True)
            for p in content
        )
    return json.dumps(content, sort_keys=True)


def chunk_keys(text: str, *, chunk_chars: int = CHUNK_CHARS, max_chunks: int = MAX_CHUNKS) -> tuple[int, ...]:
    """One key per full chunk of ``text``, each chained over the key before it. Python's string hash is
    seeded per process, which is all this needs: the keys never leave the gateway."""
    keys: list[int] = []
    parent = 0
    end = min(len(text), chunk_chars * max_chunks)
    for start in range(0, end - chunk_chars + 1, chunk_chars):
        parent = hash((parent, text[start : start + chunk_chars]))
        keys.append(parent)
    return tuple(keys)


@dataclass(frozen=True, slots=True)
class RouteHint:
    """What the router knows of one request: its prompt's chunk keys (possibly none), and the LoRA adapter it
    names (None: a base model, or LoRA affinity off)."""

    keys: tuple[int, ...]
    adapter: str | None = None


class PrefixMap:
    """Chunk key -> {upstream: when it last served a prompt with that prefix}; bounded and expiring."""

    def __init__(self, *, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._keys: OrderedDict[int, dict[str, float]] = OrderedDict()  # least recently written first

    def __len__(self) -> int:
        return len(self._keys)

    def matches(self, keys: Sequence[int]) -> dict[str, int]:
        """For each upstream known to hold a prefix of ``keys``: how many leading chunks it holds."""
        fresh_after = self._clock() - self.ttl_s
        table = self._keys
        holders: set[str] | None = None
        found: dict[str, int] = {}
        for depth, key in enumerate(keys, start=1):
            owners = table.get(key)
            if owners is None:
                break
            here = {name for name, seen in owners.items() if seen > fresh_after}
            holders = here if holders is None else holders & here
            if not holders:
                break
            for name in holders:
                found[name] = depth
        return found

    def record(self, keys: Iterable[int], upstream: str) -> None:
        """``upstream`` now holds every prefix in ``keys``; then prune to the bound and drop expired keys."""
        now = self._clock()
        table = self._keys
        for key in keys:
            owners = table.get(key)
            if owners is None:
                table[key] = {upstream: now}
            else:
                owners[upstream] = now
                table.move_to_end(key)
        while len(table) > self.max_entries:
            table.popitem(last=False)
        stale = now - self.ttl_s
        while table:
            oldest = next(iter(table.values()))
            if max(oldest.values()) > stale:
                break
            table.popitem(last=False)

    def forget(self, upstream: str) -> None:
        """Drop what ``upstream`` held (it restarted or was removed: its cache is gone)."""
        for key in [k for k, owners in self._keys.items() if owners.pop(upstream, None) is not None and not owners]:
            del self._keys[key]


class RouteObserver:
    """Where a decision goes besides the map: counted by reason, and the chunks hit per upstream (metrics)."""

    def decided(self, reason: str, upstream: str, chunks: int, hit_chunks: int) -> None:
        """One request routed to ``upstream``: its prompt had ``chunks`` chunks, ``hit_chunks`` estimated cached."""

    def adapter_placed(self, placement: str, upstream: str) -> None:
        """One LoRA adapter's request routed to ``upstream``, landing as ``placement`` (lora_affinity.PLACEMENTS)."""


class MetricsObserver(RouteObserver):
    """Counts decisions and estimated hits in the gateway's metrics."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def decided(self, reason: str, upstream: str, chunks: int, hit_chunks: int) -> None:
        m = self.metrics
        m.child(m.routing_decisions, reason).inc()
        if chunks:
            m.child(m.routing_prefix_chunks, upstream).inc(chunks)
            m.child(m.routing_prefix_hit_chunks, upstream).inc(hit_chunks)

    def adapter_placed(self, placement: str, upstream: str) -> None:
        m = self.metrics
        m.child(m.routing_adapter_decisions, placement).inc()


class PrefixRouter:
    """Chooses among available upstreams by prefix affinity against load, and remembers the choice."""

    def __init__(
        self,
        prefixes: PrefixMap,
        *,
        load_weight: float = 1.0,
        observer: RouteObserver | None = None,
        adapters: AdapterAffinity | None = None,
    ) -> None:
        self.prefixes = prefixes
        self.load_weight = load_weight
        self.observer = observer if observer is not None else RouteObserver()
        self.adapters = adapters  # None: LoRA affinity off
        self._chosen_at: dict[str, int] = {}  # upstream -> number of the decision that last chose it
        self._decisions = 0

    def hint(self, body: Any, adapter: str | None = None) -> RouteHint:
        """What routing needs of a request: its prompt's chunk keys, and ``adapter``, the served name when it is a
        LoRA adapter (kept only while LoRA affinity is on)."""
        text = prompt_text(body)
        return RouteHint(chunk_keys(text) if text else (), adapter if self.adapters is not None else None)

    def choose(self, available: list[T], hint: RouteHint) -> T:
        """The upstream for a request among ``available`` (non-empty; every one has a free permit)."""
        keys = hint.keys
        matched = self.prefixes.matches(keys) if keys else {}
        total = len(keys) or 1
        weight = self.load_weight
        chosen_at = self._chosen_at
        affinity, adapter = self.adapters, hint.adapter
        placements = (
            {target.name: affinity.placement(target.name, adapter) for target in available}
            if affinity is not None and adapter is not None
            else None
        )

        def score(target: T) -> tuple[float, int, int]:
            limiter = target.limiter
            load = limiter.inflight / limiter.limit
            value = matched.get(target.name, 0) / total - weight * load
            if placements is not None and affinity is not None:
                value += affinity.score(placements[target.name])
            return (value, limiter.free, -chosen_at.get(target.name, -1))

        chosen = max(available, key=score)
        self._decisions += 1
        chosen_at[chosen.name] = self._decisions
        hit = matched.get(chosen.name, 0)
        best = max(matched.values(), default=0)
        reason = REASON_NO_PREFIX if best == 0 else REASON_PREFIX if hit == best else REASON_LOAD
        if keys:
            self.prefixes.record(keys, chosen.name)
        self.observer.decided(reason, chosen.name, len(keys), hit)
        if placements is not None and affinity is not None and adapter is not None:
            affinity.ledger.placed(chosen.name, adapter)
            self.observer.adapter_placed(placements[chosen.name], chosen.name)
        return chosen

    def released(self, target: AdmissionTarget, hint: RouteHint) -> None:
        """A request this router placed on ``target`` ended (the admission queue's ``routed_release``)."""
        if self.adapters is not None and hint.adapter is not None:
            self.adapters.ledger.released(target.name, hint.adapter)

    def forget(self, upstream: str) -> None:
        """``upstream`` left or restarted: what it held (prefixes, adapters) is gone."""
        self.prefixes.forget(upstream)
        if self.adapters is not None:
            self.adapters.ledger.forget(upstream)


class RandomRouter(PrefixRouter):
    """Any upstream with room, at random: the baseline that ignores both cache and load. It still keeps the
    map, so its estimated prefix hits are counted like the prefix policy's."""

    def __init__(self, prefixes: PrefixMap, *, seed: int | None = None, observer: RouteObserver | None = None) -> None:
        super().__init__(prefixes, observer=observer)
        self._rng = random.Random(seed)

    def choose(self, available: list[T], hint: RouteHint) -> T:
        chosen = self._rng.choice(available)
        keys = hint.keys
        hit = self.prefixes.matches(keys).get(chosen.name, 0) if keys else 0
        if keys:
            self.prefixes.record(keys, chosen.name)
        self.observer.decided(REASON_RANDOM, chosen.name, len(keys), hit)
        return chosen

    def released(self, target: AdmissionTarget, hint: RouteHint) -> None:
        """Nothing to settle: the random policy places no adapter."""
