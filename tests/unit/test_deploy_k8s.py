"""deploy/k8s: valid Kubernetes objects, wired to each other and to the gateway's settings.

Built-in kinds (Namespace, ConfigMap, Deployment, StatefulSet, Service, PodDisruptionBudget) are
validated with `kubernetes-validate` against the Kubernetes OpenAPI schemas, strictly (unknown fields
rejected), for the newest Kubernetes it knows and an older one still in wide use. The Prometheus
Operator's ServiceMonitor is a custom resource kubernetes-validate has no schema for, so it is checked
against ``SERVICE_MONITOR_SCHEMA`` below: a minimal JSON schema written from the operator's API
reference (monitoring.coreos.com/v1 ServiceMonitor), covering the fields these manifests use and
rejecting any other (a typo there would be silently pruned by the API server).

The vLLM side's autoscalers (``deploy/k8s/vllm-autoscaling/``, applied one at a time, outside the
kustomization): the HPA is validated like the built-in kinds; the KEDA ScaledObject against KEDA's own CRD
schema, vendored verbatim in ``tests/fixtures/keda.sh_scaledobjects.yaml`` (where from: its ``.md`` note), with
unknown fields rejected.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.server.upstream.dns_discovery import parse_dns_name
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
}
ENV_FILE = K8S / "sweetspot.env"

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
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
        "action": {
            "enum": [
                "replace",
                "Replace",
                "keep",
                "Keep",
                "drop",
                "Drop",
                "hashmod",
                "HashMod",
                "labelmap",
                "LabelMap",
                "labeldrop",
                "LabelDrop",
                "labelkeep",
                "LabelKeep",
                "lowercase",
                "Lowercase",
                "uppercase",
                "Uppercase",
                "keepequal",
                "KeepEqual",
                "dropequal",
                "DropEqual",
            ]
        },
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
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": _LABELS,
                "annotations": _LABELS,
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": _LABELS, "matchExpressions": {"type": "array"}},
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
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
                            "authorization": {  # SafeAuthorization: the credentials come from a Secret
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "type": {"type": "string"},
                                    "credentials": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "required": ["key"],
                                        "properties": {
                                            "name": {"type": "string"},
                                            "key": {"type": "string"},
                                            "optional": {"type": "boolean"},
                                        },
                                    },
                                },
                            },
                            "relabelings": {"type": "array", "items": _RELABEL},
                            "metricRelabelings": {"type": "array", "items": _RELABEL},
                        },
                    },
                },
            },
        },
    },
}


def vllm_flags(args: list[str]) -> dict[str, str]:
    """``vllm serve``'s ``--flag value`` pairs (the model is positional, first, and not one of them). Every
    flag these files pass takes a value: a bare one would shift the pairs, so an odd count fails here."""
    pairs = args[1:] if args and not str(args[0]).startswith("--") else args
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


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
    assert {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "StatefulSet",
        "NetworkPolicy",
        "PrometheusRule",
    } <= kinds
    assert one("Deployment", "sweetspot")["spec"]["replicas"] >= 2
    assert one("StatefulSet", "vllm")["spec"]["replicas"] >= 2


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("item", [d for d in DOCS if (d[1]["apiVersion"], d[1]["kind"]) not in CUSTOM_KINDS], ids=_id)
def test_builtin_kinds_validate_against_the_kubernetes_openapi_schemas(
    item: tuple[str, dict[str, Any]], version: str
) -> None:
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
    container_ports = {
        p["name"]: p["containerPort"] for c in workload["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports, (
            f"{name}: monitor scrapes port {endpoint['port']!r}, not in the Service"
        )
        assert service_ports[endpoint["port"]]["targetPort"] in container_ports
    # The job label matches the jobs the alert rules and the dashboard use (job="sweetspot", job="vllm").
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == name


def test_pdb_leaves_room_to_drain_a_node() -> None:
    deployment = one("Deployment", "sweetspot")
    pdb = one("PodDisruptionBudget", "sweetspot")
    assert 0 < pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def gateway_env() -> dict[str, str]:
    """sweetspot.env read the way kustomize reads an `envs:` file: KEY=VALUE lines, # comments, blanks."""
    data: dict[str, str] = {}
    for number, line in enumerate(ENV_FILE.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and key == key.strip() and key, f"sweetspot.env:{number}: not KEY=VALUE: {line!r}"
        assert key not in data, f"sweetspot.env:{number}: {key} given twice"
        data[key] = value
    return data


def settings_from_env_file(monkeypatch: pytest.MonkeyPatch) -> Settings:
    data = gateway_env()
    fields = {f"SWEETSPOT_{name.upper()}" for name in Settings.model_fields}
    assert set(data) <= fields, f"not settings: {sorted(set(data) - fields)}"
    for key in fields:
        monkeypatch.delenv(key, raising=False)
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    return Settings()


def test_config_is_generated_so_a_change_rolls_the_pods() -> None:
    """configMapGenerator names the ConfigMap after a hash of its content and rewrites the Deployment's
    reference: a changed setting changes the pod template, so the Deployment rolls."""
    (kustomization,) = by_kind("Kustomization")
    (generator,) = kustomization["configMapGenerator"]
    assert generator["envs"] == [ENV_FILE.name]
    assert not generator.get("options", {}).get("disableNameSuffixHash")
    assert not kustomization.get("generatorOptions", {}).get("disableNameSuffixHash")
    assert generator["namespace"] == "sweetspot"
    assert not by_kind("ConfigMap"), "the gateway's ConfigMap comes from the generator, not a static manifest"
    container = one("Deployment", "sweetspot")["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"][0]["configMapRef"]["name"] == generator["name"]


def test_configmap_is_made_of_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from_env_file(monkeypatch)
    container = one("Deployment", "sweetspot")["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["http"] == settings.port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["args"] == ["serve"]


def test_upstreams_are_the_vllm_pods_one_by_one() -> None:
    """The upstreams are the headless Service's name (``dns+``): each ready pod's address is one upstream with its
    own limit, and the ServiceMonitor's relabelling gives vLLM's series the same `upstream` label, the URL of the
    pod's address."""
    settings = Settings(upstreams=gateway_env()["SWEETSPOT_UPSTREAMS"])
    vllm = one("StatefulSet", "vllm")
    service = one("Service", vllm["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"].get("publishNotReadyAddresses", False) is False  # only ready pods are in the answer
    (port,) = service["spec"]["ports"]
    (entry,) = settings.upstreams
    name = parse_dns_name(entry)
    namespace = service["metadata"]["namespace"]
    assert (name.scheme, name.host, name.port) == (
        "http",
        f"{service['metadata']['name']}.{namespace}.svc.cluster.local",
        port["port"],
    )
    assert one("Deployment", "sweetspot")["metadata"]["namespace"] == namespace
    (relabel,) = one("ServiceMonitor", "vllm")["spec"]["endpoints"][0]["relabelings"]
    assert relabel["targetLabel"] == "upstream" and relabel["sourceLabels"] == ["__address__"]
    for address in ("10.4.2.17", "fd00::17"):  # Prometheus writes an IPv6 __address__ in brackets
        shown = f"[{address}]" if ":" in address else address
        assert relabel["replacement"].replace("${1}", f"{shown}:{port['port']}") == name.url(address)


def test_gateway_pods_run_unprivileged_with_a_writable_tmp() -> None:
    pod = one("Deployment", "sweetspot")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's user
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    container = pod["containers"][0]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"] and not context["capabilities"].get("add")
    assert not context.get("privileged")
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    # a memory bound (what a leak may take before the kubelet restarts the pod) above what it asks for
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert _bytes(limits["memory"]) >= _bytes(requests["memory"]) > 0


def _bytes(quantity: str) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|k|M|G)?", quantity)
    assert m, quantity
    units = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}
    return int(m.group(1)) * units[m.group(2)]


ADMIN_SECRET = ("sweetspot-admin", "admin-api-key")


def test_metrics_and_state_need_the_admin_key_which_the_service_monitor_sends() -> None:
    """/metrics and /state show the upstreams' URLs and the gateway's inner state: the gateway requires its admin
    key from a Secret (not optional, not in the ConfigMap, not in the repository), and the gateway's
    ServiceMonitor scrapes with the same Secret's key as its bearer token."""
    deployment = one("Deployment", "sweetspot")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    (admin,) = [e for e in container["env"] if e["name"] == "SWEETSPOT_ADMIN_API_KEY"]
    ref = admin["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ADMIN_SECRET and not ref.get("optional")
    assert "SWEETSPOT_ADMIN_API_KEY" not in gateway_env(), "a key in the ConfigMap would be readable by anyone"
    assert not [d for d in by_kind("Secret") if d["metadata"]["name"] == ADMIN_SECRET[0]], "no key in the repo"
    monitor = one("ServiceMonitor", "sweetspot")
    assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]  # it reads Secrets there
    for endpoint in monitor["spec"]["endpoints"]:
        auth = endpoint["authorization"]
        assert auth.get("type", "Bearer") == "Bearer"
        assert (auth["credentials"]["name"], auth["credentials"]["key"]) == ADMIN_SECRET
    assert all("authorization" not in e for e in one("ServiceMonitor", "vllm")["spec"]["endpoints"])
    # docs/deploy.md says how to make the Secret the pods wait for
    docs = (ROOT / "docs" / "deploy.md").read_text()
    assert f"create secret generic {ADMIN_SECRET[0]} --from-literal={ADMIN_SECRET[1]}=" in docs


def test_vllm_pods_get_a_gpu_each() -> None:
    container = one("StatefulSet", "vllm")["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def vllm_args() -> dict[str, str]:
    args = one("StatefulSet", "vllm")["spec"]["template"]["spec"]["containers"][0]["args"]
    return vllm_flags(args)


def test_the_gateways_together_stay_within_vllms_max_num_seqs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each replica holds its own limit per server; during a rolling update the surge pods hold one too.
    All of them at limit_max must fit in what one vLLM server schedules (--max-num-seqs), or the excess
    waits inside vLLM, out of the gateways' reach."""
    settings = settings_from_env_file(monkeypatch)
    max_num_seqs = int(vllm_args()["--max-num-seqs"])
    assert settings.backend_max_seqs == max_num_seqs
    deployment = one("Deployment", "sweetspot")
    surge = deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"]
    assert isinstance(surge, int), "a percentage surge cannot be checked; give a number"
    autoscaled = [
        hpa
        for hpa in by_kind("HorizontalPodAutoscaler")
        if hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    ]
    most = max([deployment["spec"]["replicas"], *(hpa["spec"]["maxReplicas"] for hpa in autoscaled)])
    pods = most + surge
    assert settings.limit_max * pods <= max_num_seqs, (
        f"{pods} gateway pods (at most {most} replicas + {surge} surge) x limit_max {settings.limit_max} "
        f"> --max-num-seqs {max_num_seqs}"
    )
    assert settings.limit_min * pods <= settings.limit_max * pods <= max_num_seqs


def test_only_the_gateways_and_prometheus_reach_vllm() -> None:
    policy = one("NetworkPolicy", "vllm-ingress")
    vllm = one("StatefulSet", "vllm")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels(vllm))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    gateway_labels = pod_labels(one("Deployment", "sweetspot"))
    sources = rule["from"]
    in_namespace = [p for p in sources if "namespaceSelector" not in p]
    assert len(in_namespace) == 1 and selects(in_namespace[0]["podSelector"]["matchLabels"], gateway_labels)
    (prometheus,) = [p for p in sources if "namespaceSelector" in p]
    assert prometheus["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    for source in sources:  # every source names its pods: no empty selector that lets every pod in
        assert source["podSelector"].get("matchLabels")
    port_names = {p["name"] for p in vllm["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert [p["port"] for p in rule["ports"]] == ["http"] and "http" in port_names


def test_vllm_pods_tolerate_gpu_taints_and_get_time_to_finish() -> None:
    pod = one("StatefulSet", "vllm")["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # Long generations in flight finish after SIGTERM: well over the 30 s default.
    assert pod["terminationGracePeriodSeconds"] >= 120


def test_gateway_pods_take_no_gpu() -> None:
    """The gateway runs on CPU nodes; its GPU headroom comes from the backend's own metrics there."""
    container = one("Deployment", "sweetspot")["spec"]["template"]["spec"]["containers"][0]
    resources = container["resources"]
    assert not any("gpu" in key for part in resources.values() for key in part)


PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "labels": _LABELS,
                "annotations": _LABELS,
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string"},
                            "interval": _DURATION,
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["expr"],
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": _DURATION,
                                        "keep_firing_for": _DURATION,
                                        "labels": _LABELS,
                                        "annotations": _LABELS,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}


def test_prometheus_rule_matches_the_crd_shape() -> None:
    rule = one("PrometheusRule", "sweetspot")
    errors = list(jsonschema.Draft202012Validator(PROMETHEUS_RULE_SCHEMA).iter_errors(rule))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    broken = yaml.safe_load(yaml.safe_dump(rule))
    broken["spec"]["groups"][0]["rules"][0]["annotation"] = {}
    assert list(jsonschema.Draft202012Validator(PROMETHEUS_RULE_SCHEMA).iter_errors(broken))


def test_the_grace_period_outlasts_the_drain() -> None:
    """SIGTERM comes after preStop; the gateway then drains for drain_timeout_s and winds down (the drain's
    settle and uvicorn's own shutdown, 10 s at most) before Kubernetes may SIGKILL it."""
    pod = one("Deployment", "sweetspot")["spec"]["template"]["spec"]
    pre_stop = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain_s = float(gateway_env()["SWEETSPOT_DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] >= float(pre_stop[1]) + drain_s + 10


def test_the_autoscaler_scales_the_gateways_on_their_queue_wait() -> None:
    """The HPA targets the gateway Deployment, starts where the Deployment does, and its custom metric is
    the Prometheus Adapter's name for a histogram the gateway exports (the rule in autoscaling.yaml)."""
    from gateway.telemetry.metrics import GatewayMetrics

    (hpa,) = by_kind("HorizontalPodAutoscaler")
    deployment = one("Deployment", "sweetspot")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", "sweetspot")
    assert hpa["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert hpa["spec"]["minReplicas"] == deployment["spec"]["replicas"] < hpa["spec"]["maxReplicas"]
    (pods_metric,) = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    name = pods_metric["metric"]["name"]
    assert name.endswith("_mean")
    histogram = name.removesuffix("_mean")
    exported = {family.name for family in GatewayMetrics().registry.collect()}
    assert histogram in exported, f"{histogram} is not a metric the gateway exports"
    rule = (K8S / "autoscaling.yaml").read_text()
    assert f'as: "{name}"' in rule and f"{histogram}_sum" in rule and f"{histogram}_count" in rule
    # the pods scaled down drain first: the scale-down window outlasts the drain
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300


# ---- the vLLM side: KEDA or an HPA on the capacity signal ----------------------------------------

VLLM_AUTOSCALING = K8S / "vllm-autoscaling"
KEDA_CRD = ROOT / "tests" / "fixtures" / "keda.sh_scaledobjects.yaml"
KEDA_CRD_SHA256 = "af35555862a83933b074af14ad439c4b4ceabaf4daa3e9338e9b23e36d308d80"
HPA_TOLERANCE = 0.1  # the HPA controller's default --horizontal-pod-autoscaler-tolerance
SIGNAL = "sweetspot_upstreams_desired"


def vllm_autoscaler(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((VLLM_AUTOSCALING / name).read_text()) if d]
    return doc


def strict(schema: Any) -> Any:
    """The CRD's schema with unknown fields rejected: the API server would prune them silently."""
    if isinstance(schema, dict):
        out = {key: strict(value) for key, value in schema.items()}
        closed = "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields")
        if closed and "additionalProperties" not in schema:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def keda_scaled_object_validator() -> jsonschema.protocols.Validator:
    import hashlib

    raw = KEDA_CRD.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == KEDA_CRD_SHA256, "the vendored KEDA CRD changed: see its .md note"
    crd = yaml.safe_load(raw)
    assert crd["spec"]["names"]["kind"] == "ScaledObject"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def keda_errors(doc: dict[str, Any]) -> list[str]:
    errors = [f"{list(e.path)}: {e.message}" for e in keda_scaled_object_validator().iter_errors(doc)]
    assert (doc["apiVersion"], doc["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = doc["spec"]  # the CRD's one CEL rule (x-kubernetes-validations), which JSON schema cannot say
    low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    if isinstance(low, int) and isinstance(high, int) and low > high:
        errors.append("minReplicaCount must be less than or equal to maxReplicaCount")
    return errors


def test_the_scaled_object_matches_the_vendored_keda_crd() -> None:
    scaled = vllm_autoscaler("keda.yaml")
    assert not keda_errors(scaled), keda_errors(scaled)


def test_the_keda_schema_rejects_a_typo_a_wrong_type_and_min_over_max() -> None:
    scaled = vllm_autoscaler("keda.yaml")
    for path, value in (
        (("spec", "fallback", "failureTreshold"), 3),  # misspelt: the API server would drop it
        (("spec", "minReplicaCount"), "1"),
        (("spec", "fallback", "behavior"), "holdCurrent"),
        (("spec", "minReplicaCount"), 9),
    ):
        broken = yaml.safe_load(yaml.safe_dump(scaled))
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        assert keda_errors(broken), f"{'.'.join(path)} = {value!r} passed"
    # The CRD alone lets the typo through (the API server would prune it): rejecting it is the test's strictness.
    crd = yaml.safe_load(KEDA_CRD.read_text())
    loose = jsonschema.Draft7Validator(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    broken = yaml.safe_load(yaml.safe_dump(scaled))
    broken["spec"]["fallback"]["failureTreshold"] = 3
    assert not list(loose.iter_errors(broken))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_vllm_hpa_validates_against_the_kubernetes_openapi_schemas(version: str) -> None:
    try:
        kubernetes_validate.validate(vllm_autoscaler("hpa.yaml"), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"vllm-autoscaling/hpa.yaml is invalid for Kubernetes {version}: {exc.message} at {list(exc.path)}")


def served_model() -> str:
    args = one("StatefulSet", "vllm")["spec"]["template"]["spec"]["containers"][0]["args"]
    return vllm_args().get("--served-model-name", args[0]).split()[0]


def adapter_rule() -> dict[str, Any]:
    """The Prometheus Adapter rule written as a comment in hpa.yaml, parsed as the adapter would read it."""
    lines = (VLLM_AUTOSCALING / "hpa.yaml").read_text().splitlines()
    start = lines.index("#   externalRules:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#   "):
            break
        block.append(line.removeprefix("#   "))
    (rule,) = yaml.safe_load("\n".join(block))["externalRules"]
    return rule


def test_both_scale_the_vllm_statefulset_on_the_gateways_figure() -> None:
    """Each targets the StatefulSet the gateways send to, in its namespace, asks for the model vLLM serves and
    takes the max over gateway replicas (each exports the same pool-wide figure), on a metric the gateway
    exports and the job its ServiceMonitor scrapes it as."""
    from gateway.telemetry.metrics import GatewayMetrics

    assert SIGNAL in {family.name for family in GatewayMetrics().registry.collect()}
    vllm = one("StatefulSet", "vllm")
    keda, hpa = vllm_autoscaler("keda.yaml"), vllm_autoscaler("hpa.yaml")
    for doc in (keda, hpa):
        target = doc["spec"]["scaleTargetRef"]
        assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "StatefulSet", "vllm")
        assert doc["metadata"]["namespace"] == vllm["metadata"]["namespace"]
    gateway_job = one("Service", "sweetspot")["metadata"]["labels"][
        one("ServiceMonitor", "sweetspot")["spec"]["jobLabel"]
    ]
    model = served_model()
    (trigger,) = keda["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    rule = adapter_rule()
    for promql in (query, rule["metricsQuery"]):
        assert promql.startswith(f"max({SIGNAL}{{") and promql.endswith("})"), promql
        assert f'model="{model}"' in promql and f'job="{gateway_job}"' in promql
        assert "sum" not in promql, "a sum over gateway replicas asks for one pool per replica"
    assert f'namespace="{vllm["metadata"]["namespace"]}"' in query
    # The adapter serves the rule's series under the name the HPA asks for, per namespace.
    assert re.fullmatch(rule["name"]["matches"], SIGNAL)
    assert rule["seriesQuery"].startswith(f"{SIGNAL}{{")
    assert "<<.LabelMatchers>>" in rule["metricsQuery"]
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External" and metric["external"]["metric"]["name"] == rule["name"]["as"]
    assert "selector" not in metric["external"]["metric"], "the model is in the rule's query"


def test_replicas_follow_the_figure_one_server_for_each() -> None:
    """An External metric with an AverageValue target of 1 makes the HPA's desired replicas the figure itself
    (ceil(figure / 1)); a Value target would multiply it by the replicas running. KEDA hands its trigger to
    the HPA it makes the same way. Within [min, max] the HPA's tolerance must never hold a one-server step."""
    keda, hpa = vllm_autoscaler("keda.yaml"), vllm_autoscaler("hpa.yaml")
    (trigger,) = keda["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger.get("metricType", "AverageValue") == "AverageValue"
    assert float(trigger["metadata"]["threshold"]) == 1
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    bounds = (keda["spec"]["minReplicaCount"], keda["spec"]["maxReplicaCount"])
    assert bounds == (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"])
    low, high = bounds
    assert low >= 1, "the figure is never below 1: scaling to zero is not what it measures"
    for current in range(low, high + 1):
        for figure in range(low, high + 1):
            ratio = figure / (current * 1)  # the HPA's usage ratio for an AverageValue external metric
            if abs(1 - ratio) <= HPA_TOLERANCE:
                assert figure == current, f"{current} -> {figure} servers is within the tolerance: never taken"
            else:
                assert min(max(math.ceil(figure / 1), low), high) == figure


def test_an_absent_figure_never_shrinks_the_pool() -> None:
    """The figure is absent until a backend is measured at its limit. KEDA would read an empty answer as 0
    (down to minReplicaCount): it must be an error, and the fallback must keep at least the replicas running."""
    keda = vllm_autoscaler("keda.yaml")
    (trigger,) = keda["spec"]["triggers"]
    assert trigger["metadata"]["ignoreNullValues"] == "false"
    fallback = keda["spec"]["fallback"]
    assert fallback["behavior"] in ("currentReplicas", "currentReplicasIfHigher")
    assert fallback["failureThreshold"] >= 1
    assert keda["spec"]["minReplicaCount"] <= fallback["replicas"] <= keda["spec"]["maxReplicaCount"]
    # A scaled-down server finishes its generations first: scale down one at a time, slower than up.
    for behavior in (
        keda["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
        vllm_autoscaler("hpa.yaml")["spec"]["behavior"],
    ):
        (down,) = behavior["scaleDown"]["policies"]
        assert (down["type"], down["value"]) == ("Pods", 1)
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0


def test_the_vllm_autoscalers_are_applied_one_at_a_time() -> None:
    """Two autoscalers on one StatefulSet fight: neither is in the kustomization, each is applied alone, and
    the gateway's own HPA scales the gateway Deployment only."""
    (kustomization,) = by_kind("Kustomization")
    assert not [r for r in kustomization["resources"] if r.startswith(VLLM_AUTOSCALING.name)]
    assert sorted(p.name for p in VLLM_AUTOSCALING.glob("*.yaml")) == ["hpa.yaml", "keda.yaml"]
    for hpa in by_kind("HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for name in ("keda.yaml", "hpa.yaml"):
        assert f"kubectl apply -f deploy/k8s/vllm-autoscaling/{name}" in docs
