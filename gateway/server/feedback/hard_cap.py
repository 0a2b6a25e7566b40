"""How many requests an upstream can hold at once (its hard cap): its scheduler's own cap and how many typical
requests its KV cache holds, the smaller of them. The control loop hands it to the controller every tick."""

from __future__ import annotations

from gateway.control.knee_search.capacity import kv_cap
from gateway.server.upstream.pool import Upstream
from gateway.telemetry.backends import BackendSnapshot


def hard_cap(
    snapshot: BackendSnapshot, upstream: Upstream, planned_kv_tokens: int | None, max_seqs: int | None, now: float
) -> int | None:
    """The most concurrency the upstream can hold: the smallest of what is known of its scheduler's own
    cap (llama-server's slots; vLLM's ``--max-num-seqs``, which it does not publish, so it comes from
    ``backend_max_seqs``) and how many typical requests its KV cache holds (``capacity.kv_cap``, from
    recent requests, the last known after an idle spell; before any has finished, from the admitted requests'
    estimated sizes, ``kv_estimate``). Past the scheduler's cap requests only wait
    inside the backend, where the gateway can neither order nor time them out. None when nothing is known."""
    caps: list[int] = []
    if snapshot.total_slots:
        caps.append(int(snapshot.total_slots))
    if max_seqs:
        caps.append(max_seqs)
    size = kv_size(snapshot, planned_kv_tokens)
    footprint = upstream.kv_footprint(now) if size is not None else None
    if size is not None and footprint is not None:
        caps.append(kv_cap(size[0], size[1], footprint))
    return min(caps) if caps else None


def kv_size(snapshot: BackendSnapshot, planned_kv_tokens: int | None) -> tuple[int, int | None] | None:
    """The KV cache's size in tokens and its block size: as the backend publishes it (vLLM's
    ``cache_config_info``), else ``kv_capacity_tokens`` (no block size); None when neither is known
    (llama-server publishes none)."""
    if snapshot.kv_capacity_tokens:
        return snapshot.kv_capacity_tokens, snapshot.kv_block_size
    return (planned_kv_tokens, None) if planned_kv_tokens else None
