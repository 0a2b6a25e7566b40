"""docker-compose.yml: valid against the Compose specification, and every reference in it resolves.

No Docker engine runs here, so the file is checked the way `docker compose config` would: interpolate
``${VAR:-default}`` (with the defaults the file carries, and with the values .env.example documents),
validate against the Compose spec's JSON schema (tests/fixtures/compose-spec.json, stored verbatim), then
follow every reference: build contexts and Dockerfiles, bind mounts, named volumes, profiles and
depends_on, the gateway's SWEETSPOT_* variables (each must be a real setting, and the set must build
valid Settings), the Prometheus targets and the Grafana provisioning paths.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
SCHEMA = ROOT / "tests" / "fixtures" / "compose-spec.json"
SCHEMA_SHA256 = "bc50c2d79102aed8df21b3a13e56c9396c7a06da6cff5ce37629f2ee7eb41735"
PROFILES = ("gpu", "sim")

# Compose interpolation: $$ escapes, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}, $VAR.
_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?])?(?P<arg>[^}]*)\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


def vllm_flags(args: list[str]) -> dict[str, str]:
    """``vllm serve``'s ``--flag value`` pairs (the model is positional, first, and not one of them). Every
    flag these files pass takes a value: a bare one would shift the pairs, so an odd count fails here."""
    pairs = args[1:] if args and not str(args[0]).startswith("--") else args
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def read_env_example() -> dict[str, str]:
    """KEY=VALUE lines of .env.example, requiring a comment just above each key (its documentation)."""
    values: dict[str, str] = {}
    documented = False
    for number, line in enumerate(ENV_EXAMPLE.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            documented = False
            continue
        if stripped.startswith("#"):
            documented = not stripped.startswith("# ----") or documented
            continue
        key, sep, value = stripped.partition("=")
        assert sep, f".env.example:{number}: not KEY=VALUE: {line!r}"
        assert documented or values, f".env.example:{number}: {key} has no comment explaining it"
        assert key not in values, f".env.example:{number}: {key} given twice"
        values[key] = value
    return values


# Credentials the file refuses to default (``${VAR:?message}``): the tests supply a stand-in.
SECRETS = {"GRAFANA_ADMIN_PASSWORD": "a-test-only-password", "SWEETSPOT_ADMIN_API_KEY": "a-test-only-admin-key"}


class RequiredVariableUnset(AssertionError):
    """``${VAR:?message}`` met an unset or empty VAR: Compose stops here with the message."""


def required_variables(node: Any) -> set[str]:
    """Variables written ``${VAR:?message}`` or ``${VAR?message}``: no default on purpose."""
    text = json.dumps(node)
    return {m.group("braced") for m in _VAR.finditer(text) if m.group("op") in (":?", "?")}


def variables(node: Any) -> list[tuple[str, str | None]]:
    """Every interpolated variable in the document, with the default the file gives it (or None)."""
    found: list[tuple[str, str | None]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            found += variables(key) + variables(value)
    elif isinstance(node, list):
        for item in node:
            found += variables(item)
    elif isinstance(node, str):
        for m in _VAR.finditer(node):
            if m.group("escaped"):
                continue
            name = m.group("braced") or m.group("plain")
            default = m.group("arg") if m.group("op") in (":-", "-") else None
            found.append((name, default))
    return found


def interpolate(node: Any, env: dict[str, str]) -> Any:
    """Substitute variables as Compose does; an unset variable without a default is an error here."""
    if isinstance(node, dict):
        return {interpolate(k, env): interpolate(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(item, env) for item in node]
    if not isinstance(node, str):
        return node

    def sub(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        name = m.group("braced") or m.group("plain")
        op, arg = m.group("op"), m.group("arg")
        value = env.get(name)
        if (op == ":-" and not value) or (op == "-" and value is None):
            return arg
        if (op == ":?" and not value) or (op == "?" and value is None):
            raise RequiredVariableUnset(f"{name}: {arg}")
        if value is None:
            raise AssertionError(f"${{{name}}} is unset and has no default")
        return value

    return _VAR.sub(sub, node)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    return read_env_example()


@pytest.fixture(scope="module", params=["file defaults", ".env.example"])
def compose(request: pytest.FixtureRequest, raw: dict[str, Any], env_example: dict[str, str]) -> dict[str, Any]:
    """The compose file as Docker would see it without a .env, and with .env copied from .env.example."""
    env = {} if request.param == "file defaults" else env_example
    return interpolate(raw, {**env, **SECRETS})


def active_services(doc: dict[str, Any], profile: str) -> dict[str, dict[str, Any]]:
    """Services a `docker compose --profile <profile> up` starts: no profiles, or this one."""
    return {name: svc for name, svc in doc["services"].items() if not svc.get("profiles") or profile in svc["profiles"]}


def network_names(doc: dict[str, Any], profile: str) -> dict[str, str]:
    """Hostname -> service, for every service name and network alias reachable in a profile."""
    names: dict[str, str] = {}
    for name, svc in active_services(doc, profile).items():
        for alias in [name] + [
            a for net in (svc.get("networks") or {}).values() if net for a in net.get("aliases", [])
        ]:
            assert alias not in names, f"profile {profile}: hostname {alias!r} is claimed by {names[alias]} and {name}"
            names[alias] = name
    return names


def container_port(svc: dict[str, Any], port: int) -> bool:
    """Whether a service listens on ``port`` as far as the file says (ports, expose or its settings)."""
    published = [str(p).rsplit(":", 1)[-1].split("/")[0] for p in svc.get("ports", [])]
    exposed = [str(p) for p in svc.get("expose", [])]
    return str(port) in published + exposed


# ---- the schema and the file against it --------------------------------------------------------


def test_schema_fixture_is_the_stored_upstream_copy() -> None:
    digest = hashlib.sha256(SCHEMA.read_bytes()).hexdigest()
    assert digest == SCHEMA_SHA256, "tests/fixtures/compose-spec.json changed; see compose-spec.json.md"
    jsonschema.Draft7Validator.check_schema(json.loads(SCHEMA.read_text()))


def test_compose_file_validates_against_the_compose_spec(compose: dict[str, Any], raw: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    for label, doc in (("before interpolation", raw), ("after interpolation", compose)):
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, f"{label}:\n" + "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_schema_catches_a_broken_compose_file(compose: dict[str, Any]) -> None:
    """The validation above can fail: a misspelt key and a bad depends_on condition are rejected."""
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    broken = json.loads(json.dumps(compose))
    broken["services"]["prometheus"]["volume"] = broken["services"]["prometheus"].pop("volumes")
    broken["services"]["grafana"]["depends_on"]["prometheus"]["condition"] = "service_ready"
    messages = [e.message for e in validator.iter_errors(broken)]
    assert any(m.startswith("'volume' does not match") for m in messages), messages
    assert any("service_ready" in m for m in messages), messages


# ---- variables: every one documented in .env.example, with the same default ------------------


def test_every_variable_is_documented_in_env_example_with_the_same_default(
    raw: dict[str, Any], env_example: dict[str, str]
) -> None:
    used = variables(raw)
    assert used, "no ${VAR} in docker-compose.yml?"
    required = required_variables(raw)
    for name, default in used:
        assert name in env_example, f"${{{name}}} is used in docker-compose.yml but not documented in .env.example"
        if name in required:
            assert env_example[name] == "", f"{name} is a credential: .env.example must leave it empty"
            continue
        assert default is not None, f"${{{name}}} has no default in docker-compose.yml: the stack needs a .env to start"
        assert env_example[name] == default, (
            f"{name}: docker-compose.yml defaults to {default!r}, .env.example says {env_example[name]!r}"
        )
    unused = set(env_example) - {name for name, _ in used} - {"COMPOSE_PROFILES"}
    assert not unused, f".env.example documents variables docker-compose.yml never uses: {sorted(unused)}"


def test_credentials_have_no_default(raw: dict[str, Any], env_example: dict[str, str]) -> None:
    """Grafana's admin password and the gateway's admin key must be chosen: neither the file nor .env.example as
    shipped starts the stack, whichever of them is missing."""
    assert required_variables(raw) == set(SECRETS)
    for name in SECRETS:
        others = {key: value for key, value in SECRETS.items() if key != name}
        for env in (others, {**env_example, **others}):
            with pytest.raises(RequiredVariableUnset, match=name):
                interpolate(raw, env)
    grafana = interpolate(raw, {**env_example, **SECRETS})["services"]["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == SECRETS["GRAFANA_ADMIN_PASSWORD"]
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and grafana["GF_USERS_ALLOW_SIGN_UP"] == "false"


def published(svc: dict[str, Any]) -> list[tuple[str | None, str, str]]:
    """(host address or None for every interface, host port, container port) of each published port."""
    found = []
    for port in svc.get("ports", []):
        parts = str(port).split(":")
        host_ip = parts[0] if len(parts) == 3 else None
        found.append((host_ip, parts[-2], parts[-1]))
    return found


def test_every_published_port_listens_on_loopback_by_default(compose: dict[str, Any]) -> None:
    ports = {name: published(svc) for name, svc in compose["services"].items() if svc.get("ports")}
    assert {"sweetspot", "sweetspot-sim", "prometheus", "grafana"} <= set(ports)
    for name, entries in ports.items():
        for host_ip, _, _ in entries:
            assert host_ip == "127.0.0.1", f"{name} publishes on {host_ip or 'every interface'}, not loopback"


def test_each_published_port_can_be_exposed_deliberately(raw: dict[str, Any]) -> None:
    """One *_BIND_ADDRESS variable per published service, so exposing one exposes nothing else."""
    exposed = interpolate(raw, {**SECRETS, "GRAFANA_BIND_ADDRESS": "0.0.0.0"})
    for name, svc in exposed["services"].items():
        for host_ip, _, _ in published(svc):
            assert host_ip == ("0.0.0.0" if name == "grafana" else "127.0.0.1"), name


def test_prometheus_has_no_lifecycle_or_admin_api(compose: dict[str, Any]) -> None:
    """--web.enable-lifecycle lets anyone who reaches Prometheus POST /-/quit; the admin API deletes series."""
    command = compose["services"]["prometheus"]["command"]
    assert not [arg for arg in command if arg.startswith(("--web.enable-lifecycle", "--web.enable-admin-api"))]


def test_env_example_selects_a_real_profile(raw: dict[str, Any], env_example: dict[str, str]) -> None:
    declared = {p for svc in raw["services"].values() for p in svc.get("profiles", [])}
    assert declared == set(PROFILES)
    assert set(env_example["COMPOSE_PROFILES"].split(",")) <= declared


# ---- references to the repository ---------------------------------------------------------------


def test_build_contexts_and_dockerfiles_exist(compose: dict[str, Any]) -> None:
    built = {name: svc["build"] for name, svc in compose["services"].items() if "build" in svc}
    assert {"sweetspot", "sweetspot-sim", "sim"} <= set(built)
    for name, build in built.items():
        context = ROOT / build["context"]
        assert context.is_dir(), f"{name}: build context {context} missing"
        assert (context / build.get("dockerfile", "Dockerfile")).is_file(), f"{name}: Dockerfile missing"


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, f"{name}: image {image!r} is not pinned to a tag"


def test_bind_mounts_and_named_volumes_resolve(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes", {}))
    used: set[str] = set()
    for name, svc in compose["services"].items():
        for volume in svc.get("volumes", []):
            source, target, *mode = volume.split(":")
            assert target.startswith("/"), f"{name}: {volume}"
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: bind mount source {source} does not exist in the repo"
                assert mode == ["ro"], f"{name}: configuration from the repo should be mounted read-only: {volume}"
            else:
                assert source in declared, f"{name}: named volume {source} is not declared under volumes:"
                used.add(source)
    assert used == declared, f"declared but unused volumes: {declared - used}"


@pytest.mark.parametrize("profile", PROFILES)
def test_depends_on_targets_run_in_the_same_profile_and_have_healthchecks(
    compose: dict[str, Any], profile: str
) -> None:
    services = active_services(compose, profile)
    for name, svc in services.items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in services, f"profile {profile}: {name} depends on {dep}, which does not run in it"
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_runs_a_backend_a_gateway_prometheus_and_grafana(compose: dict[str, Any], profile: str) -> None:
    names = network_names(compose, profile)
    for host in ("vllm", "sweetspot", "prometheus", "grafana"):
        assert host in names, f"profile {profile}: nothing answers as {host!r}"
    gateway = active_services(compose, profile)[names["sweetspot"]]
    assert gateway["depends_on"][names["vllm"]]["condition"] == "service_healthy"


# ---- the gateway: settings by environment only ---------------------------------------------------


def gateway_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if n.startswith("sweetspot")}


def test_gateway_environment_is_made_of_real_settings(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {f"SWEETSPOT_{name.upper()}" for name in Settings.model_fields}
    for name, svc in gateway_services(compose).items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        unknown = {k for k in env if k.startswith("SWEETSPOT_")} - fields
        assert not unknown, f"{name}: {sorted(unknown)} are not fields of gateway/settings.py"
        for key in list(env):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings = Settings()
        assert settings.host == "0.0.0.0"
        assert settings.upstreams == ["http://vllm:8000"]
        assert container_port(svc, settings.port), f"{name}: listens on {settings.port}, publishes {svc['ports']}"
        assert "command" not in svc and "entrypoint" not in svc, f"{name}: settings come from the environment only"


def test_gateway_gets_read_only_gpu_access_for_nvml_and_vllm_gets_the_gpu(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["sweetspot"]
    assert gateway["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "NVIDIA_VISIBLE_DEVICES" not in gateway["environment"], "the device request says which GPUs"
    (devices,) = gateway["deploy"]["resources"]["reservations"]["devices"]
    (vllm_devices,) = compose["services"]["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert vllm_devices["capabilities"] == ["gpu"] and devices["capabilities"] == ["utility"]
    # The gateway's NVML must read the GPUs vLLM runs on, not every GPU of the host: Docker hands a
    # `count: N` request GPUs 0..N-1, so equal counts mean the same cards.
    assert devices["count"] != "all"
    assert devices["count"] == vllm_devices["count"]
    command = compose["services"]["vllm"]["command"]
    assert vllm_flags(command)["--tensor-parallel-size"] == str(vllm_devices["count"])
    for name in ("sim", "sweetspot-sim"):
        assert "deploy" not in compose["services"][name], f"{name} must run without a GPU"


def test_vllm_options_come_from_the_environment_file(raw: dict[str, Any]) -> None:
    command = raw["services"]["vllm"]["command"]
    assert command[0].startswith("${MODEL"), "the model is vllm serve's positional argument, from $MODEL"
    options = dict(zip(command[1::2], command[2::2], strict=True))  # every flag takes a value
    for flag, var in (
        ("--max-model-len", "MAX_MODEL_LEN"),
        ("--gpu-memory-utilization", "GPU_MEMORY_UTILIZATION"),
        ("--max-num-seqs", "MAX_NUM_SEQS"),
    ):
        assert options[flag].startswith("${" + var), f"vllm {flag} should come from ${var}"
    assert options["--port"] == "8000"
    health = " ".join(raw["services"]["vllm"]["healthcheck"]["test"])
    assert "/health" in health


def test_the_gateways_limit_is_bounded_by_vllms_max_num_seqs(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM does not publish --max-num-seqs; the gateway gets the same value, so its hard cap knows it."""
    command = compose["services"]["vllm"]["command"]
    max_num_seqs = int(vllm_flags(command)["--max-num-seqs"])
    env = {k: str(v) for k, v in compose["services"]["sweetspot"]["environment"].items() if k.startswith("SWEETSPOT_")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.backend_max_seqs == max_num_seqs
    assert settings.limit_max <= max_num_seqs


def test_sim_command_uses_real_cli_options(compose: dict[str, Any]) -> None:
    """The simulator's command line parses with the real `sweetspot sim` options and a real profile."""
    import typer.main

    from gateway.cli import _register, app
    from gateway.sim.profiles import get_profile

    _register()
    command = typer.main.get_command(app)
    args = compose["services"]["sim"]["command"]
    assert args[0] == "sim"
    ctx = command.make_context("sweetspot", list(args), resilient_parsing=False)
    sub = command.get_command(ctx, args[0])
    assert sub is not None, "no `sweetspot sim` command"
    params = sub.make_context("sim", list(args[1:])).params
    assert params["port"] == 8000 and params["host"] == "0.0.0.0"
    get_profile(params["profile"])  # raises on an unknown profile


# ---- Prometheus and Grafana wiring ---------------------------------------------------------------


def mount_target(svc: dict[str, Any], repo_path: str) -> str:
    for volume in svc["volumes"]:
        source, target, *_ = volume.split(":")
        if (ROOT / source).resolve() == (ROOT / repo_path).resolve():
            return target
    raise AssertionError(f"{repo_path} is not mounted")


@pytest.mark.parametrize("profile", PROFILES)
def test_prometheus_targets_are_services_on_their_ports(compose: dict[str, Any], profile: str) -> None:
    prom = compose["services"]["prometheus"]
    config_dir = mount_target(prom, "./deploy/prometheus")
    assert f"--config.file={config_dir}/prometheus.yml" in prom["command"]
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    for rule_file in config["rule_files"]:
        assert (ROOT / "deploy/prometheus" / rule_file).is_file(), f"rule file {rule_file} missing"
    names = network_names(compose, profile)
    services = active_services(compose, profile)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"sweetspot", "vllm"}
    for job in jobs.values():
        for target in (t for sc in job["static_configs"] for t in sc["targets"]):
            host, port = target.rsplit(":", 1)
            assert host in names, f"profile {profile}: job {job['job_name']} scrapes {host}, which is no service"
            svc = services[names[host]]
            listens = container_port(svc, int(port)) or (
                "SWEETSPOT_PORT" in svc.get("environment", {}) and svc["environment"]["SWEETSPOT_PORT"] == port
            )
            assert listens, f"profile {profile}: {names[host]} does not listen on {port}"


def test_grafana_provisioning_resolves(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    assert mount_target(grafana, "./deploy/grafana/provisioning") == "/etc/grafana/provisioning"
    dashboards_dir = mount_target(grafana, "./deploy/grafana/dashboards")

    providers = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/sweetspot.yml").read_text())["providers"]
    assert [p["options"]["path"] for p in providers] == [dashboards_dir]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dashboards_dir + "/")
    assert (ROOT / "deploy/grafana/dashboards" / home[len(dashboards_dir) + 1 :]).is_file()

    datasources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    host, port = source["url"].removeprefix("http://").split(":")
    assert host == "prometheus" and container_port(compose["services"]["prometheus"], int(port))

    # The dashboard's `datasource` variable picks Grafana's default Prometheus datasource: the provisioned one.
    assert source["type"] == "prometheus" and source["isDefault"] is True
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/sweetspot.json").read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert variable["query"] == source["type"]


def test_metrics_and_state_need_the_admin_key_which_prometheus_sends(
    compose: dict[str, Any], raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """/metrics and /state show the upstreams' URLs and the gateway's inner state: every gateway service requires
    the admin key, and Prometheus' scrape of the gateway sends the same key, from a compose secret made of the
    same variable, as its bearer token."""
    for name, svc in gateway_services(raw).items():
        assert svc["environment"]["SWEETSPOT_ADMIN_API_KEY"].startswith("${SWEETSPOT_ADMIN_API_KEY:?"), name
    for name, svc in gateway_services(compose).items():
        env = {k: str(v) for k, v in svc["environment"].items() if k.startswith("SWEETSPOT_")}
        for key in [f"SWEETSPOT_{field.upper()}" for field in Settings.model_fields]:
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert Settings().admin_api_key == SECRETS["SWEETSPOT_ADMIN_API_KEY"], name
    (secret_name,) = compose["services"]["prometheus"]["secrets"]
    assert compose["secrets"][secret_name] == {"environment": "SWEETSPOT_ADMIN_API_KEY"}
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    auth = jobs["sweetspot"]["authorization"]
    assert auth.get("type", "Bearer") == "Bearer"
    assert auth["credentials_file"] == f"/run/secrets/{secret_name}"  # where compose mounts a service's secret
    assert "credentials" not in auth, "the key comes from the secret, never written in the file"
    assert "authorization" not in jobs["vllm"], "vLLM's /metrics is the vllm service's: it takes no gateway key"


def test_the_gateway_container_is_locked_down(compose: dict[str, Any]) -> None:
    """Read-only root with a writable /tmp, no capabilities, no privilege gain, a memory bound: the gateway needs
    nothing more, and a compromised process gets nothing more."""
    for name, svc in gateway_services(compose).items():
        assert svc["read_only"] is True, name
        tmpfs = [svc["tmpfs"]] if isinstance(svc["tmpfs"], str) else svc["tmpfs"]
        assert [t.split(":")[0] for t in tmpfs] == ["/tmp"], name
        assert svc["cap_drop"] == ["ALL"] and not svc.get("cap_add"), name
        assert "no-new-privileges:true" in svc["security_opt"], name
        assert not svc.get("privileged"), name
        limit = str(svc["mem_limit"]).lower()
        m = re.fullmatch(r"(\d+)([kmg]?)b?", limit)
        assert m, f"{name}: mem_limit {limit!r}"
        size = int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2)]
        assert 256 * 2**20 <= size <= 4 * 2**30, f"{name}: mem_limit {limit} is no sensible bound"


def test_the_stop_grace_period_outlasts_the_drain(compose: dict[str, Any]) -> None:
    """docker sends SIGKILL after stop_grace_period; the gateway needs its drain and 10 s to wind down."""
    for name, service in compose["services"].items():
        if not name.startswith("sweetspot"):
            continue
        grace = service["stop_grace_period"]
        assert grace.endswith("s"), grace
        drain_s = float(service["environment"]["SWEETSPOT_DRAIN_TIMEOUT_S"])
        assert float(grace[:-1]) >= drain_s + 10, name
