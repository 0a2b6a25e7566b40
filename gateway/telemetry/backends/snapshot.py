"""What one scrape of an inference server's own signals says, as one frozen value.

The controller needs the backend's view of itself (how many requests it runs and queues, how full its
KV cache is, whether it preempts) in one shape, whatever the server. vLLM and llama-server report
different things, so every field is optional: ``None`` means "this backend does not report it" or "not
read yet", never zero.

Staleness is part of the value: ``taken_at`` is when the numbers were read (monotonic clock) and
``error`` says why the latest attempt failed, if it did. A failed scrape keeps the previous numbers
with their old ``taken_at`` and the new ``error``, so a consumer sees both the last known state and
that it is getting old (``age(now)``), and decides itself what is too old.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: The backends we read. Names match ``Settings.backend`` ("auto" is resolved before a snapshot exists);
#: "openai" is any other OpenAI-compatible server: only ``/health`` is read.
BackendKind = Literal["vllm", "llamacpp", "openai"]


@dataclass(frozen=True, slots=True)
class LoraState:
    """vLLM's multi-LoRA scheduler state from ``vllm:lora_requests_info``: the adapters of the requests it runs
    and of those it keeps waiting, and ``--max-loras`` (adapters one batch may hold; 0 when LoRA is off).

    vLLM sets the gauge to the current time under a new label set at every logging interval and never removes an
    old one, so a page holds many series; this is the newest one's (the largest value), and ``set_at`` is that
    value (wall-clock seconds since the epoch, vLLM's clock)."""

    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    max_lora: int | None = None
    set_at: float | None = None

    @property
    def enabled(self) -> bool:
        """Whether the server serves adapters at all (``--enable-lora``: ``max_lora`` is at least 1)."""
        return bool(self.max_lora)

    @property
    def full(self) -> bool:
        """``max_lora`` distinct adapters run: a request for any other waits for one of them to drain (a swap)."""
        return self.max_lora is not None and self.max_lora > 0 and len(self.running) >= self.max_lora


@dataclass(frozen=True, slots=True)
class BackendSnapshot:
    """The backend's own signals at ``taken_at`` (seconds on the scraper's clock)."""

    kind: BackendKind
    taken_at: float | None = None  # None: never scraped successfully
    error: str | None = None  # why the latest attempt failed; None when it succeeded
    healthy: bool | None = None  # /health answered 200 (False: 503 loading, error, or unreachable)
    # scheduler
    running: float | None = None  # requests being decoded (vLLM running, llama-server busy slots)
    waiting: float | None = None  # requests queued inside the backend (vLLM waiting, llama deferred)
    total_slots: int | None = None  # llama-server --parallel (from /props)
    busy_slots: int | None = None  # llama-server slots processing (from /slots, when enabled)
    # KV cache
    kv_usage: float | None = None  # 0..1; llama-server no longer reports it
    kv_capacity_tokens: int | None = None  # vLLM cache_config_info: kv_cache_size_tokens or blocks * block_size
    kv_block_size: int | None = None  # tokens per KV block (vLLM allocates a request whole blocks)
    preemptions_total: float | None = None
    # cumulative counters
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    # whether generation_tokens_total moves as tokens are made (vLLM: per engine step) rather than when
    # a request ends (llama-server): only a live counter meters throughput better than the gateway can
    generation_tokens_live: bool = False
    # inter-token latency as (sum of seconds, count): rate() them between two snapshots for a mean
    itl_seconds_sum: float | None = None
    itl_count: float | None = None
    # time to first token (vLLM histogram) as (sum, count)
    ttft_seconds_sum: float | None = None
    ttft_count: float | None = None
    # multi-LoRA serving (vLLM's vllm:lora_requests_info); None: the backend does not report it
    lora: LoraState | None = None

    def age(self, now: float) -> float | None:
        """Seconds since the numbers were read; None when they never were."""
        return None if self.taken_at is None else max(0.0, now - self.taken_at)

    def is_stale(self, now: float, max_age_s: float) -> bool:
        """True when there are no numbers or they are older than ``max_age_s``."""
        age = self.age(now)
        return age is None or age > max_age_s
