"""``vllm:lora_requests_info`` read into the backend snapshot (:func:`vllm_lora_state`).

The recorded V0 page (``tests/fixtures/vllm_metrics/``) has the gauge with LoRA off; the constructed snippets
below are labelled as such: they pin the rules no single recording shows (the newest of many label sets wins,
comma-joined names, a server without the gauge).
"""

from __future__ import annotations

from pathlib import Path

from gateway.telemetry.backends.parse import parse_samples, vllm_lora_state, vllm_snapshot
from gateway.telemetry.backends.snapshot import LoraState

VLLM = Path(__file__).parent.parent / "fixtures" / "vllm_metrics"

HEAD = "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n"


def test_recorded_v0_page_lora_off() -> None:
    samples = parse_samples((VLLM / "v0_qwen2.5-coder-1.5b_aibrix-docs.prom").read_text())
    state = vllm_lora_state(samples)
    assert state == LoraState(running=(), waiting=(), max_lora=0, set_at=1.7382173358407154e09)
    assert not state.enabled and not state.full


def test_recorded_vllm_0_32_with_an_adapter_running() -> None:
    """Real vLLM keeps the idle label set beside the newer one; the newer is the state (an adapter may be running
    and waiting at once: one request of it runs, another waits)."""
    samples = parse_samples((VLLM / "v1_0.32.0-cpu_tiny-llama-lora_sweetspot.prom").read_text())
    assert len(samples["vllm:lora_requests_info"]) == 2
    state = vllm_lora_state(samples)
    assert state is not None
    assert (state.running, state.waiting, state.max_lora) == (("tiny-lora",), ("tiny-lora",), 1)
    assert state.enabled and state.full


def test_constructed_newest_label_set_wins_over_older_ones() -> None:
    # constructed: vLLM keeps every label set it ever wrote, each valued at when it was last set
    text = HEAD + (
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters="math"} 1.7e9\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.6e9\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 1.65e9\n'
    )
    state = vllm_lora_state(parse_samples(text))
    assert state is not None
    assert (state.running, state.waiting, state.max_lora, state.set_at) == (("sql", "chat"), ("math",), 2, 1.7e9)
    assert state.enabled and state.full


def test_constructed_not_full_below_max_lora() -> None:
    text = HEAD + 'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",waiting_lora_adapters=""} 5\n'
    state = vllm_lora_state(parse_samples(text))
    assert state is not None and state.running == ("a",) and state.waiting == () and not state.full


def test_no_gauge_no_state_and_snapshot_carries_it() -> None:
    plain = parse_samples("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n")
    assert vllm_lora_state(plain) is None
    assert vllm_snapshot(plain, taken_at=0.0).lora is None
    text = HEAD + 'vllm:lora_requests_info{max_lora="1",running_lora_adapters="x",waiting_lora_adapters="y,z"} 9\n'
    snap = vllm_snapshot(parse_samples(text), taken_at=0.0)
    assert snap.lora == LoraState(running=("x",), waiting=("y", "z"), max_lora=1, set_at=9.0)


def test_constructed_unparsable_max_lora_is_unknown() -> None:
    text = HEAD + 'vllm:lora_requests_info{max_lora="None",running_lora_adapters="a",waiting_lora_adapters=""} 1\n'
    state = vllm_lora_state(parse_samples(text))
    assert state is not None and state.max_lora is None and not state.enabled and not state.full
