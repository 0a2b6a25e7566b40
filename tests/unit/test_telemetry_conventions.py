"""The gateway's metrics follow Prometheus' conventions, and its logs are JSON lines.

Checked on the exposition text a scrape gets (what Prometheus parses), not on our own objects: the
standard process/platform/GC series are there, an unknown value is an absent series (never NaN), the
backend's preemption counter is exported as a counter, and the event-loop lag probe measures lateness.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.control.window import Outcome, RequestSample, SlidingWindow
from gateway.server.admission.limiter import Limiter
from gateway.server.feedback.hard_cap import hard_cap
from gateway.server.process.logs import JsonLines, configure_logging, log_access
from gateway.server.upstream.pool import Upstream
from gateway.telemetry.backends import BackendSnapshot
from gateway.telemetry.loop_lag import LoopLagProbe
from gateway.telemetry.metrics import GatewayMetrics


def scrape(metrics: GatewayMetrics) -> tuple[str, dict[str, str]]:
    """The exposition text and each family's type, as Prometheus would read them."""
    text = generate_latest(metrics.registry).decode()
    types = {family.name: family.type for family in text_string_to_metric_families(text)}
    return text, types


def test_process_platform_and_gc_collectors_are_exported() -> None:
    _, types = scrape(GatewayMetrics())
    for family in (
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_open_fds",
        "python_info",
        "python_gc_collections",
    ):
        assert family in types, f"{family} missing from the exposition"
    assert "sweetspot_event_loop_lag_seconds" in types


def test_unknown_backend_values_are_absent_and_known_ones_exported() -> None:
    metrics = GatewayMetrics()
    known = {"kv": 0.5, "running": None, "preemptions": 7.0}
    metrics.backend_kv_usage.bind(("http://a",), lambda: known["kv"])
    metrics.backend_running.bind(("http://a",), lambda: known["running"])
    metrics.backend_waiting.bind(("http://a",), lambda: float("nan"))
    metrics.backend_preemptions.bind(("http://a",), lambda: known["preemptions"])
    text, types = scrape(metrics)
    values = [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_bucket")
    ]  # a histogram's +Inf bucket is a label, not a value
    assert values and all(math.isfinite(sample.value) for sample in values), [
        s for s in values if not math.isfinite(s.value)
    ]
    assert 'sweetspot_backend_kv_cache_usage_ratio{upstream="http://a"} 0.5' in text
    assert "sweetspot_backend_requests_running{" not in text
    assert "sweetspot_backend_requests_waiting{" not in text
    # The backend's own cumulative counter keeps its counter type, so rate() and resets work on it.
    assert types["sweetspot_backend_preemptions"] == "counter"
    assert 'sweetspot_backend_preemptions_total{upstream="http://a"} 7.0' in text
    known["kv"] = None  # the backend stopped reporting it: the series goes away with it
    assert "sweetspot_backend_kv_cache_usage_ratio{" not in scrape(metrics)[0]


async def test_loop_lag_probe_records_how_late_each_tick_ran() -> None:
    metrics = GatewayMetrics()
    now = [100.0]
    probe = LoopLagProbe(0.5, metrics.event_loop_lag, metrics.event_loop_lag_hist, clock=lambda: now[0])
    await probe.tick()
    assert probe.latest is None  # nothing to compare the first tick with
    now[0] += 0.5 + 0.12  # the loop was busy for 120 ms past the timer
    await probe.tick()
    assert probe.latest == pytest.approx(0.12)
    now[0] += 0.5
    await probe.tick()
    assert probe.latest == pytest.approx(0.0)
    text = scrape(metrics)[0]
    assert "sweetspot_event_loop_lag_seconds 0.0" in text
    assert "sweetspot_event_loop_lag_distribution_seconds_count 2.0" in text


def upstream_with_requests(prompt: int, output: int, count: int = 4) -> Upstream:
    upstream = Upstream("http://a", Limiter("http://a", 8), SlidingWindow(60.0))
    for i in range(count):
        upstream.window.add(
            RequestSample(
                arrived=i,
                admitted=i,
                finished=i + 1.0,
                first_token=i + 0.1,
                prompt_tokens=prompt,
                output_tokens=output,
                outcome=Outcome.OK,
            )
        )
    return upstream


def test_hard_cap_is_the_smallest_known_real_limit() -> None:
    upstream = upstream_with_requests(prompt=900, output=100)  # 1000 tokens a request, answers of one length
    kv = BackendSnapshot(kind="vllm", kv_capacity_tokens=400_000)
    assert hard_cap(kv, upstream, None, None, now=10.0) == 400  # KV room alone
    # vLLM's --max-num-seqs is lower than what the KV cache holds: the scheduler's cap wins.
    assert hard_cap(kv, upstream, None, 256, now=10.0) == 256
    # A cap above the KV room changes nothing.
    assert hard_cap(kv, upstream, None, 1024, now=10.0) == 400
    slots = BackendSnapshot(kind="llamacpp", total_slots=4)
    assert hard_cap(slots, upstream, None, 256, now=10.0) == 4
    assert hard_cap(BackendSnapshot(kind="vllm"), upstream, None, 64, now=10.0) == 64
    assert hard_cap(BackendSnapshot(kind="vllm"), upstream, None, None, now=10.0) is None


def test_hard_cap_counts_whole_kv_blocks() -> None:
    # Answers of one length may run in step and are counted at their end (capacity.Footprint): 232 tokens
    # a request take 8 blocks of 32 (256 tokens), and vLLM keeps one block back (its null block): 128 blocks
    # hold 127 // 8 = 15 such requests, not the 17 that 4,096 tokens / 232 would say.
    upstream = upstream_with_requests(prompt=32, output=200)
    blocks = BackendSnapshot(kind="vllm", kv_capacity_tokens=128 * 32, kv_block_size=32)
    assert hard_cap(blocks, upstream, None, None, now=10.0) == 15
    assert hard_cap(BackendSnapshot(kind="vllm", kv_capacity_tokens=128 * 32), upstream, None, None, now=10.0) == 17
    # An idle spell longer than the window keeps the last known footprint, and so the cap.
    assert hard_cap(blocks, upstream, None, None, now=1000.0) == 15
    # A planned capacity (no scrape) has no block size to round by.
    assert hard_cap(BackendSnapshot(kind="vllm", kv_block_size=32), upstream, 4096, None, now=10.0) == 17


def test_hard_cap_counts_answers_of_spread_lengths_at_their_lives_mean() -> None:
    """The tests' vLLM budget (545-token prompts, 96-160-token answers, 264 blocks of 32): 11 fit at their
    longest, 12 out of step with room for three spreads of their KV (capacity.kv_cap)."""
    upstream = Upstream("http://a", Limiter("http://a", 8), SlidingWindow(60.0))
    for i, output in enumerate(range(96, 161, 8)):
        upstream.window.add(
            RequestSample(
                arrived=i,
                admitted=i,
                finished=i + 1.0,
                first_token=i + 0.1,
                prompt_tokens=545,
                output_tokens=output,
                outcome=Outcome.OK,
            )
        )
    budget = BackendSnapshot(kind="vllm", kv_capacity_tokens=264 * 32, kv_block_size=32)
    assert hard_cap(budget, upstream, None, None, now=10.0) == 12


@pytest.fixture
def root_logging() -> Iterator[None]:
    """configure_logging replaces the root handlers; put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("sweetspot.access").setLevel(logging.NOTSET)


def test_logs_are_one_json_object_per_line(root_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    logging.getLogger("sweetspot.controller").info(
        "limit changed", extra={"event": "limit_change", "limit": 12, "upstream": "http://a"}
    )
    log_access({"event": "access", "request_id": "r1", "status": 200, "e2e_s": 0.25, "output_tokens": 16})
    try:
        raise RuntimeError("multi\nline")
    except RuntimeError:
        logging.getLogger("sweetspot.api").exception("request %s failed", "r2")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    change, access, failure = (json.loads(line) for line in lines)
    assert change["event"] == "limit_change" and change["limit"] == 12 and change["level"] == "INFO"
    assert change["logger"] == "sweetspot.controller" and "timestamp" in change
    assert access["logger"] == "sweetspot.access" and access["status"] == 200 and access["output_tokens"] == 16
    assert failure["message"] == "request r2 failed" and "RuntimeError: multi\nline" in failure["exc_info"]


def test_a_log_line_holds_any_value(root_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever a field holds, the line is one JSON object: a value JSON has no form for becomes its text,
    NaN becomes null, and a newline or a non-ASCII character in a message is escaped or kept, never a break."""
    configure_logging("info", "json")
    logging.getLogger("sweetspot.test").warning(
        "odd\nvalues: é", extra={"path": Path("/x"), "ratio": float("nan"), "nested": {"a": [1, None]}}
    )
    (line,) = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["message"] == "odd\nvalues: é" and record["level"] == "WARNING"
    assert record["path"] == "/x" and record["ratio"] is None and record["nested"] == {"a": [1, None]}
    assert record["timestamp"].endswith("+00:00")


def test_the_access_line_is_the_records_line_and_other_handlers_still_get_records(
    root_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The access log writes its line itself (no LogRecord) under the gateway's own JSON logging: the same
    fields as the formatter's line of the record would have. A handler added by anyone else gets records."""
    configure_logging("info", "json")
    fields = {"event": "access", "request_id": "r1", "status": 200, "model": "m", "e2e_s": 0.25}
    log_access(fields)
    direct = json.loads(capsys.readouterr().err)
    record = logging.getLogger("sweetspot.access").makeRecord(
        "sweetspot.access", logging.INFO, "", 0, "access", (), None, extra=fields
    )
    formatted = json.loads(JsonLines().format(record))
    assert direct.keys() == formatted.keys() and list(direct) == list(formatted)
    assert {k: v for k, v in direct.items() if k != "timestamp"} == {
        k: v for k, v in formatted.items() if k != "timestamp"
    }
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logging.getLogger().addHandler(Keep())
    log_access(fields)
    assert len(seen) == 1 and seen[0].request_id == "r1"  # type: ignore[attr-defined]
    assert json.loads(capsys.readouterr().err)["request_id"] == "r1"  # and the JSON line as before


def test_uvicorn_lines_are_json_without_terminal_colours(
    root_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # serve_app(logging_configured=True) gives uvicorn no handlers of its own: its records reach the root.
    configure_logging("info", "json")
    logging.getLogger("uvicorn.error").info(
        "Started server process [%d]", 7, extra={"color_message": "Started server process [\x1b[36m%d\x1b[0m]"}
    )
    (line,) = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["logger"] == "uvicorn.error" and record["message"] == "Started server process [7]"
    assert "color_message" not in record


def test_log_level_and_access_log_are_settings(root_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning", "json")
    logging.getLogger("sweetspot.controller").info("limit changed")
    log_access({"event": "access"})
    assert capsys.readouterr().err == ""
    configure_logging("info", "json", access_log=False)
    log_access({"event": "access"})
    logging.getLogger("sweetspot.controller").info("limit changed")
    (line,) = capsys.readouterr().err.splitlines()
    assert json.loads(line)["logger"] == "sweetspot.controller"
