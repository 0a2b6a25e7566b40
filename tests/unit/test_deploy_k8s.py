"""deploy/k8s: valid Kubernetes objects, wired to each other and to the gateway's settings.

Built-in kinds (Namespace, ConfigMap, Deployment, StatefulSet, Service, PodDisruptionBudget) are
validated with `kubernetes-validate` against the Kubernetes OpenAPI schemas, strictly (unknown fields
rejected), for the newest Kubernetes it knows and an older one still in wide use. The Prometheus
Operator's ServiceMonitor is a custom resource kubernetes-validate has no schema for, so it is checked
against ``SERVICE_MONITOR_SCHEMA`` below: a minimal JSON schema written from the operator's API
reference (monitoring.coreos.com/v1 ServiceMonitor), covering the fields these manifests use and
rejecting any other (a typo there would be silently pruned by the API server).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("kustomize.config.k8s.io/v1beta1", "Kustomization")}

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer", "minimum": 0},
        "replacement": {"type": "string"},
        "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                            "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                            "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                            "dropequal", "DropEqual"]},
    },
}
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                           "namespace": {"type": "string"}, "labels": _LABELS, "annotations": _LABELS},
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": _LABELS, "matchExpressions": {"type": "array"}}},
                "namespaceSelector": {"type": "object", "additionalProperties": False,
                                      "properties": {"any": {"type": "boolean"},
                                                     "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": _RELABEL},
                            "metricRelabelings": {"type": "array", "items": _RELABEL},
                        },
                    },
                },
            },
        },
    },
}


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((path.name, doc))
    return found


DOCS = documents()


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCS if doc["kind"] == kind]


def one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    return found


def _id(item: tuple[str, dict[str, Any]]) -> str:
    return f"{item[0]}:{item[1]['kind']}/{item[1].get('metadata', {}).get('name', '')}"


def test_the_manifests_hold_what_a_multi_replica_deployment_needs() -> None:
    kinds = {doc["kind"] for _, doc in DOCS}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceMonitor", "StatefulSet"} <= kinds
    assert one("Deployment", "sweetspot")["spec"]["replicas"] >= 2
    assert one("StatefulSet", "vllm")["spec"]["replicas"] >= 2


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("item", [d for d in DOCS if (d[1]["apiVersion"], d[1]["kind"]) not in CUSTOM_KINDS], ids=_id)
def test_builtin_kinds_validate_against_the_kubernetes_openapi_schemas(item: tuple[str, dict[str, Any]], version: str) -> None:
    _, doc = item
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{_id(item)} is invalid for Kubernetes {version}: {exc.message} at {list(exc.path)}")


def test_the_validator_rejects_a_broken_manifest() -> None:
    """The check above can fail: an unknown field and a wrong type are both caught."""
    broken = yaml.safe_load(yaml.safe_dump(one("Deployment", "sweetspot")))
    broken["spec"]["replica"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)
    broken = yaml.safe_load(yaml.safe_dump(one("Deployment", "sweetspot")))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("monitor", by_kind("ServiceMonitor"), ids=lambda d: d["metadata"]["name"])
def test_service_monitors_match_the_crd_shape(monitor: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(SERVICE_MONITOR_SCHEMA)
    errors = list(jsonschema.Draft202012Validator(SERVICE_MONITOR_SCHEMA).iter_errors(monitor))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_the_service_monitor_schema_rejects_a_typo() -> None:
    broken = yaml.safe_load(yaml.safe_dump(one("ServiceMonitor", "vllm")))
    broken["spec"]["endpoints"][0]["relabelings"][0]["source_labels"] = ["x"]
    assert list(jsonschema.Draft202012Validator(SERVICE_MONITOR_SCHEMA).iter_errors(broken))


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = by_kind("Kustomization")
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_everything_lives_in_the_namespace() -> None:
    (namespace,) = by_kind("Namespace")
    for _, doc in DOCS:
        if doc["kind"] not in ("Namespace", "Kustomization"):
            assert doc["metadata"]["namespace"] == namespace["metadata"]["name"], _id(("", doc))


# ---- wiring between the objects -----------------------------------------------------------------

def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("kind,name", [("Deployment", "sweetspot"), ("StatefulSet", "vllm")])
def test_services_pdbs_and_monitors_select_their_pods(kind: str, name: str) -> None:
    workload = one(kind, name)
    labels = pod_labels(workload)
    assert selects(workload["spec"]["selector"]["matchLabels"], labels)
    service = one("Service", name)
    assert selects(service["spec"]["selector"], labels)
    assert selects(one("PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"], labels)
    monitor = one("ServiceMonitor", name)
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["metadata"]["namespace"] in monitor["spec"]["namespaceSelector"]["matchNames"]
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    container_ports = {p["name"]: p["containerPort"] for c in workload["spec"]["template"]["spec"]["containers"]
                       for p in c["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports, f"{name}: monitor scrapes port {endpoint['port']!r}, not in the Service"
        assert service_ports[endpoint["port"]]["targetPort"] in container_ports
    # The job label matches the jobs the alert rules and the dashboard use (job="sweetspot", job="vllm").
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == name


def test_pdb_leaves_room_to_drain_a_node() -> None:
    deployment = one("Deployment", "sweetspot")
    pdb = one("PodDisruptionBudget", "sweetspot")
    assert 0 < pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def gateway_env() -> dict[str, str]:
    return one("ConfigMap", "sweetspot-config")["data"]


def test_configmap_is_made_of_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    data = gateway_env()
    fields = {f"SWEETSPOT_{name.upper()}" for name in Settings.model_fields}
    assert set(data) <= fields, f"not settings: {sorted(set(data) - fields)}"
    for key in fields:
        monkeypatch.delenv(key, raising=False)
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    container = one("Deployment", "sweetspot")["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"][0]["configMapRef"]["name"] == "sweetspot-config"
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["http"] == settings.port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["args"] == ["serve"]


def test_upstreams_are_the_vllm_pods_one_by_one() -> None:
    """One upstream URL per StatefulSet pod, through the headless Service: each server gets its own limit,
    and the ServiceMonitor's relabelling gives vLLM's series the same `upstream` label."""
    settings = Settings(upstreams=gateway_env()["SWEETSPOT_UPSTREAMS"])
    vllm = one("StatefulSet", "vllm")
    service = one("Service", vllm["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    (port,) = service["spec"]["ports"]
    expected = [f"http://{vllm['metadata']['name']}-{i}.{service['metadata']['name']}:{port['port']}"
                for i in range(vllm["spec"]["replicas"])]
    assert settings.upstreams == expected
    (relabel,) = one("ServiceMonitor", "vllm")["spec"]["endpoints"][0]["relabelings"]
    assert relabel["targetLabel"] == "upstream"
    assert relabel["replacement"].replace("${1}", f"{vllm['metadata']['name']}-0") == expected[0]


def test_gateway_pods_run_unprivileged_with_a_writable_tmp() -> None:
    pod = one("Deployment", "sweetspot")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's user
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}


def test_vllm_pods_get_a_gpu_each() -> None:
    container = one("StatefulSet", "vllm")["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_the_grace_period_outlasts_the_drain() -> None:
    """SIGTERM comes after preStop; the gateway then drains for drain_timeout_s and winds down (the drain's
    settle and uvicorn's own shutdown, 10 s at most) before Kubernetes may SIGKILL it."""
    pod = one("Deployment", "sweetspot")["spec"]["template"]["spec"]
    pre_stop = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain_s = float(gateway_env()["SWEETSPOT_DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] >= float(pre_stop[1]) + drain_s + 10
