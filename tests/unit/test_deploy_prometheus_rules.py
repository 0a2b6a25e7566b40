"""The alert rules: each one tested with promtool, each with a runbook section, and the Kubernetes
PrometheusRule carrying exactly the same groups.

``promtool test rules`` runs deploy/prometheus/tests/sweetspot-alerts.test.yml, where each alert is shown
firing on synthetic series (and staying quiet where it should). promtool comes from Debian's prometheus
package (`make prometheus`); without it these tests fail and say so.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "sweetspot-alerts.yml"
RULE_TESTS = PROM / "tests" / "sweetspot-alerts.test.yml"
K8S_RULE = ROOT / "deploy" / "k8s" / "prometheus-rules.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("`promtool` is not on PATH: run `make prometheus` (Debian's prometheus package ships it)")
    return found


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        result = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"


def test_the_unit_tests_can_fail(tmp_path: Path) -> None:
    """promtool compares every label and annotation: one changed expected word fails the run."""
    text = RULE_TESTS.read_text().replace("../sweetspot-alerts.yml", str(RULES))
    broken = tmp_path / "broken.test.yml"
    broken.write_text(
        text.replace(
            'severity: critical, job: sweetspot, instance: "gw:8080"}',
            'severity: warning, job: sweetspot, instance: "gw:8080"}',
            1,
        )
    )
    result = subprocess.run([promtool(), "test", "rules", str(broken)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr


def test_every_alert_is_shown_firing_in_the_promtool_tests() -> None:
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    names = {alert["alert"] for alert in alerts()}
    assert names - firing == set(), f"alerts never shown firing: {sorted(names - firing)}"
    assert (firing | quiet) <= names, f"tests of alerts that do not exist: {sorted((firing | quiet) - names)}"


def test_the_alerts_an_on_call_needs_exist() -> None:
    names = {alert["alert"] for alert in alerts()}
    for needed in (
        "SweetspotClientTTFTHigh",
        "SweetspotUpstreamErrorRatioHigh",
        "SweetspotRejectionRateHigh",
        "SweetspotGatewayTargetAbsent",
        "SweetspotGatewayDown",
        "SweetspotNoHealthyUpstream",
        "SweetspotEventLoopLagging",
    ):
        assert needed in names


def runbook_sections() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^## (\S+)\s*$", RUNBOOK.read_text(), re.M)}


def test_every_alert_links_its_runbook_section_and_every_section_has_its_alert() -> None:
    sections = runbook_sections()
    names = {alert["alert"] for alert in alerts()}
    for alert in alerts():
        url = alert["annotations"].get("runbook_url")
        assert url == f"docs/runbook.md#{alert['alert'].lower()}", f"{alert['alert']}: runbook_url {url!r}"
        assert alert["alert"] in sections, f"docs/runbook.md has no section '## {alert['alert']}'"
    assert sections == names, f"runbook sections without an alert: {sorted(sections - names)}"


def load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("k8s_prometheus_rule", ROOT / "scripts" / "k8s-prometheus-rule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kubernetes_prometheus_rule_carries_the_same_groups() -> None:
    rule = yaml.safe_load(K8S_RULE.read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"], (
        "deploy/k8s/prometheus-rules.yaml differs from the rules: run python scripts/k8s-prometheus-rule.py"
    )
    assert K8S_RULE.read_text() == load_generator().render()


def test_promtool_accepts_the_prometheus_rules_groups(tmp_path: Path) -> None:
    groups = tmp_path / "groups.yml"
    groups.write_text(yaml.safe_dump({"groups": yaml.safe_load(K8S_RULE.read_text())["spec"]["groups"]}))
    result = subprocess.run([promtool(), "check", "rules", str(groups)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
