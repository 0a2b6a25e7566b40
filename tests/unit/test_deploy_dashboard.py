"""The Grafana dashboard and the alert rules, read statically: every metric they name exists.

The gateway's names come from its own registry (gateway/telemetry/metrics.py, with prometheus-client's
`_total`/`_bucket`/`_sum`/`_count` suffixes); vLLM's from the list below (vLLM V1, 0.11+, the series the
dashboard reads). tests/integration/test_deploy_prometheus.py then runs every one of these expressions on
a real Prometheus scraping a gateway under load; this test names the culprit without a Prometheus.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.telemetry.metrics import GatewayMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "sweetspot.json"
RULES = ROOT / "deploy" / "prometheus" / "sweetspot-alerts.yml"

VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
VLLM_COUNTERS = ("vllm:num_preemptions_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total")
VLLM_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
)
PROMETHEUS_SERIES = ("up",)

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
}


def exported_names(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_sum", "_count"),
            "info": ("_info",),
            "summary": ("_sum", "_count"),
        }.get(family.type, ("",))
        names |= {family.name + s for s in suffixes}
    return names


def known_names() -> set[str]:
    names = exported_names(GatewayMetrics().registry)
    names |= set(VLLM_GAUGES) | set(VLLM_COUNTERS) | set(PROMETHEUS_SERIES)
    names |= {h + s for h in VLLM_HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords or labels."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', " ", expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    tokens = re.finditer(r"(?<![\w.:$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", text)
    return {m.group(1) for m in tokens if m.group(1).lower() not in _KEYWORDS}


def dashboard_targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query, row panels' children included."""
    found = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                found.append((inner["title"], target["expr"]))
    return found


def rule_exprs() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(rule.get("alert") or rule["record"], rule["expr"]) for group in groups for rule in group["rules"]]


DASH = json.loads(DASHBOARD.read_text())


def test_metric_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, upstream) (rate(sweetspot_ttft_seconds_bucket{upstream=~"$upstream"}'
        '[$__rate_interval]))) / on (job) group_left up{job="x"} > bool 1e-9 and vllm:num_requests_running'
    )
    assert metric_names(expr) == {"sweetspot_ttft_seconds_bucket", "up", "vllm:num_requests_running"}


@pytest.mark.parametrize("where,expr", dashboard_targets(DASH) + rule_exprs())
def test_every_metric_named_exists(where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{where}: no metric in {expr!r}"
    unknown = names - known_names()
    assert not unknown, f"{where}: {sorted(unknown)} are not exported by the gateway nor by vLLM"


def test_panels_cover_what_operators_need() -> None:
    titles = {title for title, _ in dashboard_targets(DASH)}
    for needed in (
        "Limit vs in-flight vs queued",
        "Output tokens/s",
        "Time to first token",
        "Time per output token",
        "Queue wait (admitted)",
        "Rejections by reason",
        "Controller decisions by reason",
        "GPU headroom",
        "Upstream KV-cache usage",
        "Upstream running and waiting",
        "Gateway overhead",
        "Preemptions",
        "Retries and failovers",
        "Backend scrape errors",
        "Prompt tokens/s",
        "Queue wait by outcome",
        "Event-loop lag",
        "Tokens per request",
        "Backends: desired vs serving",
        "Demand vs capacity",
        "Capacity per backend",
        "Upstreams joining and leaving",
    ):
        assert needed in titles, f"no panel {needed!r}"


def test_upstream_variable_is_defined_and_used() -> None:
    (variable,) = [v for v in DASH["templating"]["list"] if v["name"] == "upstream"]
    assert variable["query"]["query"] == "label_values(sweetspot_limit, upstream)"
    assert variable["includeAll"] and variable["allValue"] == ".*"
    per_upstream = [e for _, e in dashboard_targets(DASH) if 'upstream=~"$upstream"' in e]
    assert len(per_upstream) >= 20


def test_capacity_row_aggregates_replicas_as_documented() -> None:
    """The capacity signal's row (docs/deploy.md, "The capacity signal"): filtered by the `model` variable, the
    desired figure taken with max over replicas (each exports the same pool-wide figure; a sum would ask for R
    times the pool), and every capacity series the gateway exports shown somewhere."""
    (variable,) = [v for v in DASH["templating"]["list"] if v["name"] == "model"]
    assert variable["query"]["query"] == "label_values(sweetspot_upstreams_serving, model)"
    assert variable["includeAll"] and variable["allValue"] == ".*"
    titles = (
        "Backends: desired vs serving",
        "Demand vs capacity",
        "Capacity per backend",
        "Upstreams joining and leaving",
    )
    exprs = [e for title, e in dashboard_targets(DASH) if title in titles]
    assert exprs and all('model=~"$model"' in e for e in exprs), exprs
    named = set().union(*(metric_names(e) for e in exprs))
    capacity = {n for n in exported_names(GatewayMetrics().registry) if "capacity_" in n or "upstreams_" in n}
    capacity |= {"sweetspot_demand_requests_per_second"}
    assert capacity <= named, sorted(capacity - named)
    desired = [e for e in exprs if "sweetspot_upstreams_desired" in e]
    assert desired and all(e.startswith("max by (model) (sweetspot_upstreams_desired") for e in desired), desired
    (row,) = [p for p in DASH["panels"] if p["type"] == "row" and p["title"] == "Capacity and scaling"]
    below = [p for p in DASH["panels"] if p["gridPos"]["y"] == row["gridPos"]["y"] + 1]
    assert {p["title"] for p in below} == set(titles)


def test_panel_ids_are_unique_and_the_grid_does_not_overlap() -> None:
    ids = [p["id"] for p in DASH["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in DASH["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_alerts_have_durations_severity_and_annotations() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = [rule for group in groups for rule in group["rules"] if "alert" in rule]
    names = {a["alert"] for a in alerts}
    for needed in (
        "SweetspotQueueSaturated",
        "SweetspotRejectionRateHigh",
        "SweetspotControllerPinnedAtMinimum",
        "SweetspotUpstreamUnhealthy",
        "SweetspotBackendMetricsStale",
        "SweetspotBackendKVCacheNearFull",
    ):
        assert needed in names
    for alert in alerts:
        assert re.fullmatch(r"\d+[smh]", alert["for"]), alert["alert"]
        assert alert["labels"]["severity"] in ("warning", "critical"), alert["alert"]
        assert alert["annotations"]["summary"] and len(alert["annotations"]["description"]) > 80, alert["alert"]


def all_datasources(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and isinstance(value, dict):
                found.append(value)
            else:
                found += all_datasources(value)
    elif isinstance(node, list):
        for item in node:
            found += all_datasources(item)
    return found


def test_datasource_is_a_variable_so_the_dashboard_imports_anywhere() -> None:
    """No hard-coded uid: imported into an existing Grafana (kube-prometheus-stack's), the `datasource`
    variable offers that Grafana's Prometheus datasources instead of pointing at one that does not exist."""
    (variable,) = [v for v in DASH["templating"]["list"] if v["name"] == "datasource"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    assert DASH["templating"]["list"][0] is variable, "the datasource variable must come first: others query it"
    sources = [d for d in all_datasources(DASH) if d.get("type") != "grafana"]
    assert sources and all(d == {"type": "prometheus", "uid": "${datasource}"} for d in sources), sources


def test_rates_not_range_increases() -> None:
    """increase() over $__rate_interval changes value with the zoom level; a rate per second does not."""
    for title, expr in dashboard_targets(DASH):
        assert "increase(" not in expr, f"{title}: {expr}"


def test_hard_cap_has_its_own_axis() -> None:
    """A hard cap in the thousands beside a limit of 8 would flatten both on one axis."""
    (panel,) = [p for p in DASH["panels"] if p["title"] == "Limit vs in-flight vs queued"]
    (cap,) = [t for t in panel["targets"] if "sweetspot_limit_hard_cap" in t["expr"]]
    overrides = [
        o for o in panel["fieldConfig"]["overrides"] if o["matcher"] == {"id": "byFrameRefID", "options": cap["refId"]}
    ]
    properties = {p["id"]: p["value"] for o in overrides for p in o["properties"]}
    assert properties.get("custom.axisPlacement") == "right"
    others = [t for t in panel["targets"] if t is not cap]
    assert not any(
        o["matcher"].get("options") in {t["refId"] for t in others} for o in panel["fieldConfig"]["overrides"]
    )
