"""The upstreams file (gateway/server/upstream/discovery.py): its format, the diff, a file that changes or goes
bad; the siblings' limit a joining upstream starts at; removing every series of an upstream that left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.control.window import SlidingWindow
from gateway.server.admission.limiter import Limiter
from gateway.server.feedback.membership import sibling_limit
from gateway.server.upstream.discovery import BadUpstreamsFile, UpstreamsFile, diff, parse_upstreams, united
from gateway.server.upstream.pool import Upstream
from gateway.telemetry.metrics import GatewayMetrics


def test_a_file_lists_one_url_a_line_with_comments() -> None:
    text = """
    # pool A
    http://vllm-0.vllm:8000/
    http://vllm-1.vllm:8000   # added later

    https://vllm-2.example/v1
    http://vllm-0.vllm:8000
    """
    assert parse_upstreams(text) == ["http://vllm-0.vllm:8000", "http://vllm-1.vllm:8000", "https://vllm-2.example/v1"]
    assert parse_upstreams("") == []
    assert parse_upstreams("# nothing yet\n") == []


@pytest.mark.parametrize(
    "line",
    ["vllm-0:8000", "ftp://host", "http://", "http://a:8000 http://b:8000", "http://host:notaport", "http://h/?q=1"],
)
def test_a_line_that_is_no_base_url_is_refused_naming_its_line(line: str) -> None:
    with pytest.raises(BadUpstreamsFile, match="line 2"):
        parse_upstreams(f"http://ok:1\n{line}\n")


def test_the_diff_says_what_joins_and_what_leaves_in_order() -> None:
    change = diff(["http://a", "http://b", "http://c"], ["http://c", "http://d", "http://a", "http://e"])
    assert change.added == ["http://d", "http://e"]
    assert change.removed == ["http://b"]
    assert change
    assert not diff(["http://a"], ["http://a"])
    assert united(["http://a/", "http://b"], ["http://b", "http://c"]) == ["http://a", "http://b", "http://c"]


def _write(path: Path, text: str, mtime_ns: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_the_file_is_read_again_when_it_changes_and_a_bad_one_keeps_the_last_good_list(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "upstreams"
    _write(path, "http://a:1\n", 1_000_000_000)
    listing = UpstreamsFile(path)
    assert listing.load() == ["http://a:1"]
    assert listing.poll() is None  # unchanged
    _write(path, "http://a:1\nhttp://b:2\n", 2_000_000_000)
    assert listing.poll() == ["http://a:1", "http://b:2"]
    _write(path, "http://a:1\n# a comment only\nhttp://b:2\n", 3_000_000_000)
    assert listing.poll() is None  # touched, but the same list
    _write(path, "http://a:1\nnot a url\n", 4_000_000_000)
    assert listing.poll() is None
    assert "line 2" in caplog.text
    assert listing.urls == ["http://a:1", "http://b:2"]  # the last good list stays
    path.unlink()
    assert listing.poll() is None
    assert listing.urls == ["http://a:1", "http://b:2"]
    _write(path, "http://c:3\n", 5_000_000_000)
    assert listing.poll() == ["http://c:3"]
    assert listing.poll(force=True) is None  # read again at once (SIGHUP), nothing new


def test_a_bad_file_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "upstreams"
    path.write_text("garbage here\n")
    with pytest.raises(BadUpstreamsFile):
        UpstreamsFile(path).load()
    with pytest.raises(FileNotFoundError):
        UpstreamsFile(tmp_path / "missing").load()


def _upstream(url: str, limit: int, model: str | None) -> Upstream:
    upstream = Upstream(url, Limiter(url, limit), SlidingWindow(10.0))
    upstream.models = None if model is None else [{"id": model}]
    return upstream


def test_a_joining_upstream_starts_at_the_median_limit_of_its_siblings_serving_its_model() -> None:
    pool = [_upstream("http://a", 10, "m"), _upstream("http://b", 30, "m"), _upstream("http://c", 20, "m")]
    pool.append(_upstream("http://x", 99, "other-model"))
    newcomer = _upstream("http://new", 1, "m")
    assert sibling_limit([*pool, newcomer], newcomer) == 20
    pool[1].retiring = True  # a leaving upstream is no sibling
    assert sibling_limit(pool, newcomer) == 10  # the lower middle
    assert sibling_limit(pool, _upstream("http://lone", 1, "third")) is None
    unknown = _upstream("http://unknown", 1, None)  # its list unread: siblings only when the pool serves one model
    assert sibling_limit(pool, unknown) is None
    assert sibling_limit(pool[:3], unknown) == 10


def test_forgetting_an_upstream_removes_every_series_it_labels() -> None:
    metrics = GatewayMetrics()
    kept, gone = "http://kept:1", "http://gone:2"
    for name in (kept, gone):
        metrics.limit.labels(name).set(3)
        metrics.upstream_retries.labels(name, "failover").inc()
        metrics.child(metrics.upstream_requests, name, "ok", "m").inc()
        metrics.backend_kv_usage.bind((name,), lambda: 0.5)
    assert metrics.forget_upstream(gone) == 4
    samples = [s for family in metrics.registry.collect() for s in family.samples]
    assert not [s for s in samples if s.labels.get("upstream") == gone]
    assert {s.name for s in samples if s.labels.get("upstream") == kept} >= {
        "sweetspot_limit",
        "sweetspot_upstream_retries_total",
        "sweetspot_upstream_requests_total",
        "sweetspot_backend_kv_cache_usage_ratio",
    }
