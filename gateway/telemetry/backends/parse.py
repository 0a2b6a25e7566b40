"""Pure parsers: a backend's ``/metrics`` text (and llama-server's ``/props`` / ``/slots`` JSON) to numbers.

No I/O and no clock here: the scraper fetches, these functions read, so every rule below is tested on
recorded texts of real servers (``tests/fixtures/vllm_metrics/``, ``tests/fixtures/llama_server/``).

vLLM renamed metrics across versions, so each signal is a list of names tried in order, newest first:

- KV usage: ``vllm:kv_cache_usage_perc`` (V1, 0.10+), else ``vllm:gpu_cache_usage_perc`` (V0; kept as a
  deprecated alias for a while). A fraction 0..1 despite the ``_perc``.
- inter-token latency: ``vllm:inter_token_latency_seconds`` (V1), else ``vllm:time_per_output_token_seconds``.
- preemptions: ``vllm:num_preemptions_total`` (a counter), else a bare ``vllm:num_preemptions``.
- multi-LoRA: ``vllm:lora_requests_info``, a gauge whose labels carry the state (``running_lora_adapters``,
  ``waiting_lora_adapters``: comma-joined adapter names; ``max_lora``) and whose value is when it was set
  (:func:`vllm_lora_state` reads the newest series).

A V1 server with data parallelism labels series by ``engine``; counts are summed over engines, and KV
usage is the fullest engine's (the one that preempts first).

llama-server (``--metrics``) reports ``llamacpp:requests_processing`` / ``requests_deferred`` and token and
time counters. Its KV-cache gauges were removed upstream, so KV usage stays ``None`` for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.backends.snapshot import BackendKind, BackendSnapshot, LoraState

# name -> list of (labels, value), one entry per sample line
Samples = dict[str, list[tuple[dict[str, str], float]]]

VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
VLLM_ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
VLLM_PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
VLLM_LORA_INFO = "vllm:lora_requests_info"


class MetricsParseError(ValueError):
    """The text is not Prometheus exposition format."""


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text page, by sample name (``x_total``, ``x_bucket``, ...)."""
    out: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except (ValueError, IndexError, TypeError) as exc:  # the parser raises these on malformed lines
        raise MetricsParseError(f"not Prometheus text: {exc}") from exc
    return out


def detect_kind(samples: Samples) -> BackendKind | None:
    """``vllm`` or ``llamacpp`` from metric prefixes, None when neither shows."""
    if any(name.startswith("vllm:") for name in samples):
        return "vllm"
    if any(name.startswith("llamacpp:") for name in samples):
        return "llamacpp"
    return None


def _values(samples: Samples, name: str) -> list[float]:
    return [value for _, value in samples.get(name, ())]


def _total(samples: Samples, names: Iterable[str]) -> float | None:
    """Sum over all series of the first name present."""
    for name in names:
        values = _values(samples, name)
        if values:
            return sum(values)
    return None


def _maximum(samples: Samples, names: Iterable[str]) -> float | None:
    for name in names:
        values = _values(samples, name)
        if values:
            return max(values)
    return None


def _histogram(samples: Samples, bases: Iterable[str]) -> tuple[float | None, float | None]:
    """(sum, count) of the first histogram present, summed over its series."""
    for base in bases:
        total, count = _total(samples, [base + "_sum"]), _total(samples, [base + "_count"])
        if count is not None:
            return total, count
    return None, None


def _kv_capacity_tokens(samples: Samples) -> int | None:
    """KV capacity in tokens from ``vllm:cache_config_info`` labels, summed over engines.

    Newer vLLM states it (``kv_cache_size_tokens``, which also holds for hybrid models whose blocks are
    not all alike); older ones give ``num_gpu_blocks`` and ``block_size``. "None" (not profiled yet) or
    a missing label skips that engine.
    """
    capacity = 0
    for labels, _ in samples.get("vllm:cache_config_info", ()):
        try:
            capacity += int(labels["kv_cache_size_tokens"])
            continue
        except (KeyError, ValueError):
            pass
        try:
            capacity += int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            continue
    return capacity or None


def _kv_block_size(samples: Samples) -> int | None:
    """Tokens per KV block from ``vllm:cache_config_info`` (the largest when engines differ: the coarser
    rounding is the safer one)."""
    sizes: list[int] = []
    for labels, _ in samples.get("vllm:cache_config_info", ()):
        try:
            sizes.append(int(labels["block_size"]))
        except (KeyError, ValueError):
            continue
    return max(sizes) if sizes else None


def _adapter_names(value: str | None) -> tuple[str, ...]:
    """vLLM joins adapter names with commas (no spaces); an empty label is no adapter."""
    return tuple(name for name in (value or "").split(",") if name)


def vllm_lora_state(samples: Samples) -> LoraState | None:
    """The running and waiting adapters and ``max_lora`` from ``vllm:lora_requests_info``; None without it.

    Every label set vLLM ever wrote stays on the page (a gauge keeps its children), each valued at the time it
    was last set, so the newest series (the largest value) is the scheduler's state now; older ones are history.
    """
    series = samples.get(VLLM_LORA_INFO)
    if not series:
        return None
    labels, value = max(series, key=lambda item: item[1])
    try:
        max_lora: int | None = int(labels.get("max_lora", ""))
    except ValueError:
        max_lora = None
    return LoraState(
        running=_adapter_names(labels.get("running_lora_adapters")),
        waiting=_adapter_names(labels.get("waiting_lora_adapters")),
        max_lora=max_lora,
        set_at=value,
    )


def vllm_snapshot(samples: Samples, taken_at: float) -> BackendSnapshot:
    """vLLM's signals; fields vLLM does not report (this version) stay None."""
    itl_sum, itl_count = _histogram(samples, VLLM_ITL)
    ttft_sum, ttft_count = _histogram(samples, ["vllm:time_to_first_token_seconds"])
    return BackendSnapshot(
        kind="vllm",
        taken_at=taken_at,
        running=_total(samples, ["vllm:num_requests_running"]),
        waiting=_total(samples, ["vllm:num_requests_waiting"]),
        kv_usage=_maximum(samples, VLLM_KV_USAGE),
        kv_capacity_tokens=_kv_capacity_tokens(samples),
        kv_block_size=_kv_block_size(samples),
        preemptions_total=_total(samples, VLLM_PREEMPTIONS),
        prompt_tokens_total=_total(samples, ["vllm:prompt_tokens_total"]),
        generation_tokens_total=_total(samples, ["vllm:generation_tokens_total"]),
        generation_tokens_live=True,  # counted per engine step (iteration stats), not per finished request
        itl_seconds_sum=itl_sum,
        itl_count=itl_count,
        ttft_seconds_sum=ttft_sum,
        ttft_count=ttft_count,
        lora=vllm_lora_state(samples),
    )


def llama_snapshot(
    samples: Samples | None,
    taken_at: float,
    props: Mapping[str, Any] | None = None,
    slots: list[Mapping[str, Any]] | None = None,
) -> BackendSnapshot:
    """llama-server's signals from ``/metrics`` (None when started without ``--metrics``), ``/props`` and
    ``/slots`` (None when started with ``--no-slots``).

    ``llamacpp:tokens_predicted_seconds_total`` adds up every slot's generation time, so divided by
    ``tokens_predicted_total`` it is the mean time between tokens *of one stream*: the ITL. Both are
    added when a request ends, not per token, so they lag long generations (``generation_tokens_live``
    stays False: the gateway's own count of a whole answer is as good).
    """
    s = samples or {}
    busy = sum(1 for slot in slots if slot.get("is_processing")) if slots is not None else None
    total_slots = props.get("total_slots") if props else None
    running = _total(s, ["llamacpp:requests_processing"])
    return BackendSnapshot(
        kind="llamacpp",
        taken_at=taken_at,
        running=running if running is not None else (float(busy) if busy is not None else None),
        waiting=_total(s, ["llamacpp:requests_deferred"]),
        total_slots=int(total_slots) if isinstance(total_slots, (int, float)) else None,
        busy_slots=busy,
        prompt_tokens_total=_total(s, ["llamacpp:prompt_tokens_total"]),
        generation_tokens_total=_total(s, ["llamacpp:tokens_predicted_total"]),
        itl_seconds_sum=_total(s, ["llamacpp:tokens_predicted_seconds_total"]),
        itl_count=_total(s, ["llamacpp:tokens_predicted_total"]),
    )


def with_error(previous: BackendSnapshot, error: str, healthy: bool | None = False) -> BackendSnapshot:
    """The last known numbers, marked with why the newest scrape failed (``taken_at`` is kept)."""
    return replace(previous, error=error, healthy=healthy)
