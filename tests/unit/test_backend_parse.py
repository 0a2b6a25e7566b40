"""The pure backend parsers, on recorded /metrics texts of real servers and on small constructed texts.

Recorded texts live in ``tests/fixtures/vllm_metrics/`` and ``tests/fixtures/llama_server/`` (each says
where it came from). The constructed snippets below are labelled as such: they pin the fallback and
aggregation rules (which name wins, engines summed) that no single recording exercises.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.telemetry.backends.parse import (
    MetricsParseError,
    detect_kind,
    llama_snapshot,
    parse_samples,
    vllm_snapshot,
    with_error,
)
from gateway.telemetry.backends.snapshot import BackendSnapshot

FIXTURES = Path(__file__).parent.parent / "fixtures"
VLLM = FIXTURES / "vllm_metrics"
LLAMA = FIXTURES / "llama_server"


def samples_of(path: Path):
    return parse_samples(path.read_text())


# --- recorded vLLM texts -------------------------------------------------------------------------------------------


def test_vllm_v0_recording_old_names_and_kv_capacity() -> None:
    snap = vllm_snapshot(samples_of(VLLM / "v0_qwen2.5-coder-1.5b_aibrix-docs.prom"), taken_at=5.0)
    assert snap.kind == "vllm" and snap.taken_at == 5.0 and snap.error is None
    assert (snap.running, snap.waiting) == (0.0, 0.0)
    assert snap.kv_usage == 0.0  # from vllm:gpu_cache_usage_perc: the only KV name V0 had
    assert snap.preemptions_total == 0.0
    assert (snap.prompt_tokens_total, snap.generation_tokens_total) == (148.0, 955.0)
    assert snap.kv_capacity_tokens == 81767 * 16  # num_gpu_blocks * block_size from cache_config_info
    assert snap.kv_block_size == 16
    assert snap.itl_count is None and snap.ttft_count is None  # not in this (cut-off) listing


def test_vllm_0_32_cpu_recording_kv_size_and_block_size() -> None:
    snap = vllm_snapshot(samples_of(VLLM / "v1_0.32.0-cpu_tiny-llama_sweetspot.prom"), taken_at=0.0)
    assert (snap.kv_capacity_tokens, snap.kv_block_size) == (3072, 32)  # kv_cache_size_tokens, block_size


def test_vllm_early_v1_recording_still_on_gpu_cache_usage_perc() -> None:
    samples = samples_of(VLLM / "v1_0.7_qwen2.5-coder-32b_production-stack-318.prom")
    assert detect_kind(samples) == "vllm"
    snap = vllm_snapshot(samples, taken_at=0.0)
    assert (snap.running, snap.waiting, snap.kv_usage) == (0.0, 0.0, 0.0)
    assert snap.kv_capacity_tokens is None  # no cache_config_info in the excerpt: unknown, not zero


def test_vllm_0_10_recording_new_kv_name_with_engine_label() -> None:
    snap = vllm_snapshot(samples_of(VLLM / "v1_0.10.0_glm-4.5_production-stack-617.prom"), taken_at=0.0)
    assert snap.kv_usage == pytest.approx(9.75010481363281e-06)
    assert snap.running is None and snap.preemptions_total is None  # absent from the excerpt


@pytest.mark.parametrize("path", sorted(VLLM.glob("*.prom")), ids=lambda p: p.name)
def test_every_vllm_recording_is_detected_as_vllm(path: Path) -> None:
    assert detect_kind(samples_of(path)) == "vllm"


# --- recorded llama-server texts -----------------------------------------------------------------------------------


def test_llama_server_recording() -> None:
    samples = samples_of(LLAMA / "metrics_busy.prom")
    props = json.loads((LLAMA / "props.json").read_text())
    slots = json.loads((LLAMA / "slots_busy.json").read_text())
    assert detect_kind(samples) == "llamacpp"
    snap = llama_snapshot(samples, 3.0, props, slots)
    assert snap.kind == "llamacpp" and snap.taken_at == 3.0
    assert snap.total_slots == props["total_slots"] == 4
    assert snap.running == sum(v for _, v in samples["llamacpp:requests_processing"])
    assert snap.running is not None and snap.running > 0  # recorded while requests were decoding
    assert snap.busy_slots == sum(1 for s in slots if s["is_processing"])
    assert snap.waiting == samples["llamacpp:requests_deferred"][0][1]
    assert snap.kv_usage is None  # llama-server no longer reports its KV cache
    assert snap.generation_tokens_total == samples["llamacpp:tokens_predicted_total"][0][1]
    assert snap.itl_seconds_sum == samples["llamacpp:tokens_predicted_seconds_total"][0][1]
    assert snap.itl_count == snap.generation_tokens_total


def test_llama_server_idle_recording() -> None:
    snap = llama_snapshot(
        samples_of(LLAMA / "metrics_idle.prom"), 0.0, json.loads((LLAMA / "props.json").read_text()), None
    )
    assert snap.running == 0.0 and snap.waiting == 0.0 and snap.busy_slots is None


def test_llama_server_without_metrics_uses_slots_for_running() -> None:
    slots = json.loads((LLAMA / "slots_busy.json").read_text())
    snap = llama_snapshot(None, 0.0, {"total_slots": 4}, slots)
    assert snap.running == snap.busy_slots == sum(1 for s in slots if s["is_processing"])
    assert snap.generation_tokens_total is None


# --- the rules, on constructed texts (not recordings) --------------------------------------------------------------

BOTH_NAMES = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99
"""


def test_new_kv_name_wins_when_both_are_exported() -> None:
    assert vllm_snapshot(parse_samples(BOTH_NAMES), 0.0).kv_usage == 0.25


TWO_ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.9
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="m"} 5.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="None"} 1.0
"""


def test_engines_are_summed_and_kv_is_the_fullest_engine() -> None:
    snap = vllm_snapshot(parse_samples(TWO_ENGINES), 0.0)
    assert (snap.running, snap.waiting, snap.preemptions_total) == (7.0, 3.0, 7.0)
    assert snap.kv_usage == 0.9
    assert snap.kv_capacity_tokens == 1600  # the "None" engine (not profiled yet) is skipped


OLD_ITL = """\
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 10.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.5
vllm:time_per_output_token_seconds_count{model_name="m"} 10.0
"""
NEW_ITL = """\
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.2
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 4.0
"""


def test_itl_falls_back_to_time_per_output_token_and_prefers_the_new_name() -> None:
    old = vllm_snapshot(parse_samples(OLD_ITL), 0.0)
    assert (old.itl_seconds_sum, old.itl_count) == (0.5, 10.0)
    both = vllm_snapshot(parse_samples(NEW_ITL + OLD_ITL), 0.0)
    assert (both.itl_seconds_sum, both.itl_count) == (0.2, 4.0)


def test_bare_preemptions_name_of_older_exporters() -> None:
    text = '# TYPE vllm:num_preemptions gauge\nvllm:num_preemptions{model_name="m"} 3.0\n'
    assert vllm_snapshot(parse_samples(text), 0.0).preemptions_total == 3.0


def test_detect_kind_on_neither() -> None:
    assert detect_kind(parse_samples("# TYPE process_open_fds gauge\nprocess_open_fds 4.0\n")) is None


def test_malformed_text_raises_a_parse_error() -> None:
    with pytest.raises(MetricsParseError):
        parse_samples("<html><body>502 Bad Gateway</body></html>\n")


def test_with_error_keeps_numbers_and_age() -> None:
    snap = BackendSnapshot(kind="vllm", taken_at=10.0, running=3.0, healthy=True)
    failed = with_error(snap, "GET /metrics: timed out")
    assert failed.running == 3.0 and failed.taken_at == 10.0
    assert failed.error == "GET /metrics: timed out" and failed.healthy is False
    assert failed.age(now=14.0) == 4.0
    assert failed.is_stale(now=14.0, max_age_s=3.0) and not failed.is_stale(now=12.0, max_age_s=3.0)
    assert BackendSnapshot(kind="vllm").age(1.0) is None
    assert BackendSnapshot(kind="vllm").is_stale(1.0, 100.0)
