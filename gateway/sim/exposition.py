"""vLLM's Prometheus metrics, with vLLM's names, types, label sets and buckets.

Transcribed from vLLM V1's ``PrometheusStatLogger`` (``vllm/v1/metrics/loggers.py``, 0.11/0.12
series): every series carries ``model_name`` and ``engine`` labels, counters are exported with
the ``_total`` suffix (and prometheus-client's ``_created``), and ``vllm:cache_config_info`` is a
gauge fixed at 1 whose labels describe the KV cache. Deprecated names that vLLM now hides
(``vllm:gpu_cache_usage_perc``, ``vllm:time_per_output_token_seconds``) are left out.

With LoRA enabled, ``vllm:lora_requests_info`` is vLLM's too: a gauge set to the current (wall) time under the
label set ``max_lora``, ``waiting_lora_adapters``, ``running_lora_adapters`` (comma-joined names) at every
update; vLLM never removes an old label set, so its page holds the whole history, and a reader takes the newest
series. The simulator keeps the :data:`LORA_INFO_SERIES_KEPT` newest to bound its memory. One series is the
simulator's own, not vLLM's: ``sweetspot_sim_lora_loads_total``, the adapter loads scheduling caused (what a
benchmark of LoRA routing counts; vLLM exports no such counter).

The simulator has its own registry, so several simulators (or a gateway) can share one process
in tests without name clashes. Latencies are observed in *wall-clock* seconds (engine time
divided by the time scale), so what a client or a gateway in front measures and what this
exports agree at any ``--time-scale``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.sim.profiles import Profile

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort", "error")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Label sets of ``vllm:lora_requests_info`` kept (vLLM keeps them all).
LORA_INFO_SERIES_KEPT = 64


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    out: list[int] = []
    exp = 1
    while True:
        for m in (1, 2, 5):
            v = m * exp
            if v > max_value:
                return out
            out.append(v)
        exp *= 10


class VllmMetrics:
    """The series a vLLM server exports, bound to one model name and engine index 0."""

    def __init__(
        self,
        profile: Profile,
        model_name: str,
        *,
        prefix_caching: bool = True,
        max_loras: int | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        names = ["model_name", "engine"]
        lv = (model_name, "0")
        ml = profile.max_model_len

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=r).labels(*lv)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=r).labels(*lv)

        def hist(name: str, doc: str, buckets: tuple[float, ...] | list[int]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(*lv)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", [*names, "finished_reason"], registry=r
        )
        self.success = {reason: success.labels(*lv, reason) for reason in FINISH_REASONS}
        self.req_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", build_1_2_5_buckets(ml)
        )
        self.req_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", build_1_2_5_buckets(ml)
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_TOKEN_BUCKETS
        )
        self.max_num_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            build_1_2_5_buckets(ml),
        )
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20])
        self.params_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", build_1_2_5_buckets(ml)
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", TOKEN_LATENCY_BUCKETS
        )
        self.request_tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS
        )
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.lora_info: Gauge | None = None
        self.lora_loads: Counter | None = None
        self._max_lora = str(max_loras or 0)
        self._lora_sets: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._wall_clock = wall_clock
        if max_loras:
            self.lora_info = Gauge(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                multiprocess_mode="sum",
                registry=r,
            )
            self.lora_loads = Counter(
                "sweetspot_sim_lora_loads",
                "Simulator only (not a vLLM series): LoRA adapters loaded because a batch needed one not resident.",
                registry=r,
            )
            self.set_lora([], [])  # an idle server's page shows the empty label set
        info = cache_config_labels(profile, prefix_caching=prefix_caching)
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info), registry=r).labels(
            **info
        ).set(1)

    def set_lora(self, running: Sequence[str], waiting: Sequence[str]) -> None:
        """vLLM's ``set_to_current_time`` on the label set of the adapters running and waiting now."""
        gauge = self.lora_info
        if gauge is None:
            return
        key = (",".join(waiting), ",".join(running))
        gauge.labels(self._max_lora, *key).set(self._wall_clock())
        sets = self._lora_sets
        sets[key] = None
        sets.move_to_end(key)
        while len(sets) > LORA_INFO_SERIES_KEPT:
            old, _ = sets.popitem(last=False)
            gauge.remove(self._max_lora, *old)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def cache_config_labels(profile: Profile, *, prefix_caching: bool = True) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info``: vLLM stringifies its CacheConfig fields."""
    return {
        "block_size": str(profile.block_size),
        "cache_dtype": profile.kv_cache_dtype,
        "calculate_kv_scales": "False",
        "cpu_offload_gb": "0",
        "enable_prefix_caching": str(prefix_caching),
        "engine": "0",
        "gpu_memory_utilization": str(profile.gpu_memory_utilization),
        "is_attention_free": "False",
        "kv_cache_size_tokens": str(profile.kv_capacity_tokens),
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(profile.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "swap_space": "4",
    }
