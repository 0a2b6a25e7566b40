"""LoRA affinity: an adapter's request goes where the adapter runs or is resident, weighed against load.

One vLLM serves a base model and many LoRA adapters, but one batch holds at most ``max_loras`` distinct adapters
(its GPU LoRA slots), and only a bounded set stays loaded (``max_cpu_loras``, least recently used out). A request
for an adapter that runs on the upstream joins the batch at once; one for an adapter that is loaded but not
running takes a free slot; one for an adapter that is not loaded costs a load (tens of milliseconds stalling the
whole batch); and when ``max_loras`` other adapters run, vLLM's scheduler skips it until one of them has no
request left: it waits behind requests that arrived after it (a *swap*). With several upstreams serving the same
adapters, sending each adapter where it already is keeps every upstream's set of adapters small, so swaps and
loads become rare; llm-d's LoRA-affinity scorer does the same in Kubernetes' inference gateway.

What the gateway knows of an upstream's adapters, freshest first:

* the adapters of the requests it has in flight there (its own :class:`AdapterLedger`, exact and instant);
* vLLM's ``vllm:lora_requests_info`` from the backend scrape (:class:`~gateway.telemetry.backends.LoraState`):
  the running adapters of every client's requests, and ``max_lora``, every ``metrics_interval_s``;
* the adapters it sent there most recently: likely still loaded, as vLLM evicts the least recently used.

Each candidate upstream gets a *placement* and the score adds ``weight`` for ``running``, half of it for
``resident``, nothing for ``cold`` (a free slot, a load) and subtracts ``swap_penalty`` for ``swap``. The router
adds this to the prefix share and subtracts ``load_weight x in-flight/limit``, so a hot adapter spreads over a
second upstream once the first is busier than its affinity is worth.

What this never does is change *when* a request is admitted: the choice is made among the upstreams that have
room under their limit when the admission queue's order reaches the request, as for prefix routing. A request
for a cold adapter keeps its place in the queue and takes the first free slot any eligible upstream offers (the
swap penalty only steers it to an upstream that has a free adapter slot, where one has room), so no run of hot
adapters can hold it back at the gateway.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable

from gateway.telemetry.backends.snapshot import LoraState

#: Where an adapter's request lands (the ``placement`` label of ``sweetspot_routing_adapter_decisions_total``).
PLACEMENT_RUNNING = "running"  # the adapter runs on the chosen upstream: it joins the batch
PLACEMENT_RESIDENT = "resident"  # it ran there recently and likely is still loaded; a free slot takes it
PLACEMENT_COLD = "cold"  # not known there: a free slot takes it, likely after a load
PLACEMENT_SWAP = "swap"  # max_lora other adapters run there: it waits for one to drain (every upstream was so)
PLACEMENTS = (PLACEMENT_RUNNING, PLACEMENT_RESIDENT, PLACEMENT_COLD, PLACEMENT_SWAP)

#: Adapters the ledger remembers per upstream as recently sent (the residency estimate reads the newest
#: ``max_lora`` of them; more is kept for upstreams whose ``max_lora`` is not known yet).
RECENT_MAX = 64


class AdapterLedger:
    """Per upstream: the adapters of the requests the gateway has in flight there, and those it sent there most
    recently (newest last)."""

    def __init__(self, *, recent_max: int = RECENT_MAX) -> None:
        self.recent_max = recent_max
        self._inflight: dict[str, Counter[str]] = {}
        self._recent: dict[str, OrderedDict[str, None]] = {}

    def placed(self, upstream: str, adapter: str) -> None:
        self._inflight.setdefault(upstream, Counter())[adapter] += 1
        recent = self._recent.setdefault(upstream, OrderedDict())
        recent[adapter] = None
        recent.move_to_end(adapter)
        while len(recent) > self.recent_max:
            recent.popitem(last=False)

    def released(self, upstream: str, adapter: str) -> None:
        counts = self._inflight.get(upstream)
        if counts is None or counts[adapter] <= 0:
            return
        counts[adapter] -= 1
        if not counts[adapter]:
            del counts[adapter]

    def inflight(self, upstream: str) -> set[str]:
        """Adapters with requests of this gateway in flight on ``upstream``."""
        counts = self._inflight.get(upstream)
        return set(counts) if counts else set()

    def recent(self, upstream: str, count: int) -> list[str]:
        """The ``count`` adapters most recently sent to ``upstream``, newest first."""
        recent = self._recent.get(upstream)
        if not recent or count <= 0:
            return []
        out: list[str] = []
        for name in reversed(recent):
            out.append(name)
            if len(out) >= count:
                break
        return out

    def forget(self, upstream: str) -> None:
        self._inflight.pop(upstream, None)
        self._recent.pop(upstream, None)


class AdapterAffinity:
    """Scores upstreams for an adapter's request; ``state_of`` reads an upstream's last scraped LoRA state."""

    def __init__(
        self,
        state_of: Callable[[str], LoraState | None],
        *,
        weight: float = 0.5,
        swap_penalty: float = 1.0,
        ledger: AdapterLedger | None = None,
    ) -> None:
        self.state_of = state_of
        self.weight = weight
        self.swap_penalty = swap_penalty
        self.ledger = ledger if ledger is not None else AdapterLedger()

    def placement(self, upstream: str, adapter: str) -> str:
        """Where ``adapter``'s request would land on ``upstream`` (one of :data:`PLACEMENTS`)."""
        state = self.state_of(upstream)
        running = self.ledger.inflight(upstream)
        if state is not None:
            running.update(state.running)
        if adapter in running:
            return PLACEMENT_RUNNING
        max_lora = state.max_lora if state is not None and state.max_lora else None
        if max_lora is not None and len(running) >= max_lora:
            return PLACEMENT_SWAP
        if adapter in self.ledger.recent(upstream, max_lora or 1):
            return PLACEMENT_RESIDENT
        return PLACEMENT_COLD

    def score(self, placement: str) -> float:
        if placement == PLACEMENT_RUNNING:
            return self.weight
        if placement == PLACEMENT_RESIDENT:
            return self.weight / 2
        if placement == PLACEMENT_SWAP:
            return -self.swap_penalty
        return 0.0
