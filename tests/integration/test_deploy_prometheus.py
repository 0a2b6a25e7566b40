"""The dashboard and the alert rules, proven on real data: a real Prometheus scrapes a gateway under load.

One stack for the module, all real processes on loopback:

    openai SDK --> `sweetspot serve` (env-only settings, as in the container) --> `sweetspot sim`
                           ^ /metrics                                              ^ /metrics (vLLM format)
                           +------------------ prometheus (from PATH) -------------+

Prometheus runs the project's own deploy/prometheus/prometheus.yml with only what a laptop needs changed:
the targets point at the loopback ports, intervals are 1 s, and the rule file path is absolute. A small
limit and queue make the load queue and get rejected, so queue and rejection series exist. Then every
PromQL expression of the Grafana dashboard and of the alert rules goes through Prometheus' HTTP API.

Prometheus and promtool come from Debian's package (`make prometheus` runs scripts/install-prometheus.sh);
without them these tests fail and say so.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from gateway.common.processes import LISTENING, RunningProcess, free_port, start_process, sweetspot

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "sweetspot.json"
DOCKERFILE = ROOT / "Dockerfile"
SCRAPE_S = 1
# What Grafana would put for $__rate_interval with a 1 s scrape (at least 4 scrapes), widened so the
# whole load phase falls in the window.
RATE_WINDOW = "1m"
MAX_QUEUE = 3
# The gateway's admin key (SWEETSPOT_ADMIN_API_KEY, required by the compose file): Prometheus sends it from a file,
# as it does from the compose secret.
ADMIN_KEY = "a-test-only-admin-key"
LIMIT = 2


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"`{name}` is not on PATH: run `make prometheus` (scripts/install-prometheus.sh installs "
            f"Debian's prometheus package); these tests need a real Prometheus."
        )
    return found


@dataclass
class Stack:
    sim: RunningProcess
    gateway: RunningProcess
    prometheus: RunningProcess
    prom_url: str
    config: Path
    load: Counter[str] = field(default_factory=Counter)
    sim_model: str = ""
    started: float = 0.0  # when the load began (Unix seconds)

    @property
    def gateway_port(self) -> int:
        return int(self.gateway.url.rsplit(":", 1)[1])

    def api(self, path: str, **params: str) -> dict[str, Any]:
        url = f"{self.prom_url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400/422 carry Prometheus' error in the body
            return json.loads(exc.read())

    def query(self, expr: str) -> dict[str, Any]:
        return self.api("query", query=expr, time=f"{time.time():.3f}")

    def query_range(self, expr: str) -> dict[str, Any]:
        """``expr`` over the stack's life from the load's start to now, one point per scrape: what a Grafana
        panel asks for (``/api/v1/query_range``) to draw the dashboard's time range."""
        return self.api(
            "query_range", query=expr, start=f"{self.started:.3f}", end=f"{time.time():.3f}", step=f"{SCRAPE_S}s"
        )


def prometheus_config(sim_url: str, gateway_url: str, key_file: Path) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with loopback targets, 1 s intervals, an absolute rule path, and the admin
    key's file where the compose secret would be mounted."""
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["global"].update(
        scrape_interval=f"{SCRAPE_S}s", scrape_timeout=f"{SCRAPE_S}s", evaluation_interval=f"{SCRAPE_S}s"
    )
    config["rule_files"] = [str(PROM_DIR / f) for f in config["rule_files"]]
    targets = {"sweetspot": gateway_url, "vllm": sim_url}
    assert {job["job_name"] for job in config["scrape_configs"]} == set(targets)
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]].removeprefix("http://")]}]
        if "authorization" in job:
            assert job["authorization"]["credentials_file"].startswith("/run/secrets/"), job["authorization"]
            job["authorization"]["credentials_file"] = str(key_file)
    return config


async def drive_load(base_url: str, load: Counter[str]) -> None:
    """A burst far over limit + queue (429s), then steady over-limit load (queueing) for a few seconds,
    mixing streamed and unstreamed chat and legacy completions."""
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    model = (await client.models.list()).data[0].id

    async def one(i: int) -> bool:
        try:
            if i % 5 == 4:
                await client.completions.create(model=model, prompt="Count to ten:", max_tokens=12)
            elif i % 2:
                stream = await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"Say something, {i}."}],
                    max_tokens=16,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                async for _ in stream:
                    pass
            else:
                await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": f"Say something, {i}."}], max_tokens=16
                )
            load["ok"] += 1
            return True
        except openai.APIStatusError as exc:
            load[str(exc.status_code)] += 1
            return False

    await asyncio.gather(*(one(i) for i in range(4 * (LIMIT + MAX_QUEUE))))  # the burst
    stop = time.monotonic() + 6.0

    async def worker(w: int) -> None:
        i = w
        while time.monotonic() < stop:
            if not await one(i):
                await asyncio.sleep(0.2)  # a rejected client backs off before retrying
            i += LIMIT + MAX_QUEUE + 1

    await asyncio.gather(*(worker(w) for w in range(LIMIT + MAX_QUEUE + 1)))  # one more than fits: queueing
    await client.close()


def wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = tool("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    with start_process(
        sweetspot("sim", "--host", "127.0.0.1", "--port", "0", "--time-scale", "2"),
        ready_pattern=LISTENING,
        ready_url="{url}/health",
    ) as sim:
        # A short real sweep of the simulator, handed to the gateway as the docs describe, so the sweep's
        # reference series (sweet spot, peak tokens/s) exist as they do in a deployment that ran one.
        sweep = subprocess.run(
            sweetspot(
                "sweep",
                "--url",
                sim.url,
                "--levels",
                "1,2,4",
                "--requests",
                "8",
                "--prompt-len",
                "32",
                "--output-len",
                "16",
                "--quiet",
                "--out",
                str(tmp / "sweep"),
            ),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert sweep.returncode == 0, f"sweetspot sweep failed:\n{sweep.stdout}{sweep.stderr}"
        env = {
            # Settings by environment only, exactly as the container gets them.
            "SWEETSPOT_HOST": "127.0.0.1",
            "SWEETSPOT_ADMIN_API_KEY": ADMIN_KEY,
            "SWEETSPOT_PORT": "0",
            "SWEETSPOT_UPSTREAMS": sim.url,
            "SWEETSPOT_BACKEND": "vllm",
            "SWEETSPOT_INITIAL_LIMIT": str(LIMIT),
            "SWEETSPOT_LIMIT_MAX": str(LIMIT),
            "SWEETSPOT_MAX_QUEUE": str(MAX_QUEUE),
            "SWEETSPOT_QUEUE_TIMEOUT_S": "60",
            "SWEETSPOT_CONTROL_INTERVAL_S": "0.5",
            "SWEETSPOT_METRICS_INTERVAL_S": "0.5",
            "SWEETSPOT_HEALTH_INTERVAL_S": "0.5",
            # The capacity signal counts a backend's capacity once its limit has bound for a whole window: a 2 s
            # window lets the 6 s of over-limit load measure it, so the "Capacity and scaling" panels have data.
            "SWEETSPOT_WINDOW_S": "2",
            "SWEETSPOT_SWEEP_RESULT": str(tmp / "sweep" / "sweep.json"),
        }
        with start_process(sweetspot("serve"), env=env, ready_pattern=LISTENING, ready_url="{url}/readyz") as gateway:
            config = tmp / "prometheus.yml"
            key_file = tmp / "sweetspot_admin_api_key"
            key_file.write_text(ADMIN_KEY)
            config.write_text(yaml.safe_dump(prometheus_config(sim.url, gateway.url, key_file), sort_keys=False))
            port = free_port()
            prom_url = f"http://127.0.0.1:{port}"
            cmd = [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ]
            with start_process(cmd, ready_url=f"{prom_url}/-/ready", timeout=60) as prom:
                s = Stack(sim, gateway, prom, prom_url, config)
                with urllib.request.urlopen(f"{sim.url}/v1/models", timeout=10) as resp:
                    s.sim_model = json.loads(resp.read())["data"][0]["id"]
                started = s.started = time.time()
                asyncio.run(drive_load(gateway.url, s.load))
                loaded = time.time()

                def scraped_after_load() -> bool:
                    targets = s.api("targets")["data"]["activeTargets"]
                    return len(targets) == 2 and all(
                        t["health"] == "up" and _ts(t["lastScrape"]) > loaded + SCRAPE_S for t in targets
                    )

                def rules_evaluated() -> bool:
                    rules = [r for g in s.api("rules")["data"]["groups"] for r in g["rules"]]
                    return bool(rules) and all(_ts(r["lastEvaluation"]) > started for r in rules)

                wait_for("both targets scraped after the load", scraped_after_load)
                wait_for("every rule evaluated", rules_evaluated)
                yield s


def _ts(rfc3339: str) -> float:
    """Prometheus' RFC 3339 timestamps (nanoseconds, 'Z') as Unix seconds."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", rfc3339)
    assert m, rfc3339
    from datetime import datetime

    base = datetime.fromisoformat(m.group(1) + (m.group(3).replace("Z", "+00:00")))
    return base.timestamp() + float(m.group(2) or 0)


# ---- the expressions under test -----------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_targets() -> list[tuple[str, str]]:
    found = []
    for panel in dashboard()["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                found.append((inner["title"], target["expr"]))
    return found


def rule_expressions() -> list[tuple[str, str]]:
    groups = yaml.safe_load((PROM_DIR / "sweetspot-alerts.yml").read_text())["groups"]
    return [(r.get("alert") or r["record"], r["expr"]) for g in groups for r in g["rules"]]


def grafana(expr: str, upstream: str) -> str:
    """Replace Grafana's template variables the way Grafana would before sending the query."""
    for var, value in (
        ("$__rate_interval", RATE_WINDOW),
        ("$__interval", f"{SCRAPE_S}s"),
        ("${upstream}", upstream),
        ("$upstream", upstream),
        ("${model}", ".*"),
        ("$model", ".*"),
    ):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unreplaced template variable in {expr!r}"
    return expr


def gpu_only(expr: str) -> bool:
    """Expressions reading only NVML gauges: they have data only where the gateway sees an NVIDIA GPU."""
    names = re.findall(r"\b(sweetspot_\w+|vllm:\w+|up|process_\w+|python_\w+)\b", expr)
    assert names, f"no metric name recognised in {expr!r}"
    return all(name.startswith("sweetspot_gpu_") for name in names)


def nvml_gpus() -> int:
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:  # no driver, no library (NVMLError_LibraryNotFound): no GPU
        return 0


def finite_series(result: dict[str, Any]) -> list[dict[str, Any]]:
    assert result["status"] == "success", result
    data = result["data"]
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": data["result"]}]
    if data["resultType"] == "matrix":  # a range query: a series counts if any of its points is finite
        return [s for s in data["result"] if any(math.isfinite(float(v)) for _, v in s["values"])]
    return [s for s in data["result"] if math.isfinite(float(s["value"][1]))]


# ---- tests --------------------------------------------------------------------------------------


def test_load_queued_and_was_rejected(stack: Stack) -> None:
    """The scraped numbers are the client's numbers: what Prometheus holds is this load, not an accident."""
    assert stack.load["ok"] > 0 and stack.load["429"] > 0, stack.load
    rejected = finite_series(stack.query('sum(sweetspot_rejections_total{reason="queue_full"})'))
    assert float(rejected[0]["value"][1]) == stack.load["429"]
    waited = finite_series(stack.query("sum(sweetspot_queue_wait_seconds_count)"))
    assert float(waited[0]["value"][1]) >= stack.load["ok"]
    assert float(finite_series(stack.query(f"max_over_time(sweetspot_queue_depth[{RATE_WINDOW}])"))[0]["value"][1]) > 0


def test_gateway_series_follow_the_conventions(stack: Stack) -> None:
    """Standard process and GC series, the event-loop lag, queue wait for every outcome, a model label."""
    for expr in (
        'process_cpu_seconds_total{job="sweetspot"}',
        'process_resident_memory_bytes{job="sweetspot"}',
        'python_gc_collections_total{job="sweetspot"}',
        "sweetspot_event_loop_lag_seconds",
        "sweetspot_event_loop_lag_distribution_seconds_count",
    ):
        assert finite_series(stack.query(expr)), f"no {expr}"
    by_outcome = {
        s["metric"]["outcome"]: float(s["value"][1])
        for s in finite_series(stack.query("sum by (outcome) (sweetspot_queue_wait_seconds_count)"))
    }
    assert by_outcome["rejected"] == stack.load["429"], by_outcome  # every 429 was a (zero-length) wait too
    assert by_outcome["admitted"] >= stack.load["ok"], by_outcome
    priorities = {
        s["metric"]["priority"]
        for s in finite_series(stack.query("sum by (priority) (sweetspot_queue_wait_seconds_count)"))
    }
    assert priorities == {"standard"}  # the load sent no priority header: the default class
    model = stack.sim_model
    served = finite_series(stack.query('sum by (model) (sweetspot_requests_total{status="200"})'))
    assert [s["metric"].get("model") for s in served] == [model]
    assert finite_series(stack.query(f'sweetspot_output_tokens_total{{model="{model}"}}'))
    assert finite_series(stack.query(f'sweetspot_request_output_tokens_count{{model="{model}"}}'))


def test_the_gateways_exposition_has_no_nan_or_infinity(stack: Stack) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with pytest.raises(urllib.error.HTTPError) as refused:  # the admin key is required, as in the compose stack
        urllib.request.urlopen(f"{stack.gateway.url}/metrics", timeout=10)
    assert refused.value.code == 401
    request = urllib.request.Request(f"{stack.gateway.url}/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert samples
    bad = [(s.name, s.labels, s.value) for s in samples if not math.isfinite(s.value)]
    assert not bad, f"unknown values must be absent, not NaN/Inf: {bad}"


def test_every_request_left_one_json_access_line(stack: Stack) -> None:
    total = sum(stack.load.values())

    def access_lines() -> list[dict[str, Any]]:
        records = [json.loads(line) for line in stack.gateway.output().splitlines() if line.startswith("{")]
        return [r for r in records if r.get("logger") == "sweetspot.access"]

    lines = wait_for(f"{total} access lines", lambda: (found := access_lines()) and len(found) >= total and found)
    assert len(lines) == total, f"{len(lines)} access lines for {total} requests"
    assert len({line["request_id"] for line in lines}) == total
    statuses = Counter("ok" if line["status"] == 200 else str(line["status"]) for line in lines)
    assert statuses == stack.load
    served = [line for line in lines if line["status"] == 200]
    assert all(
        line["upstream"] == stack.sim.url
        and line["output_tokens"] > 0
        and line["e2e_s"] > 0
        and line["model"] == stack.sim_model
        for line in served
    )
    refused = [line for line in lines if line["status"] == 429]
    assert all(line["reason"] == "queue_full" and line["upstream"] is None for line in refused)


def test_template_variable_lists_the_upstream(stack: Stack) -> None:
    (variable,) = [v for v in dashboard()["templating"]["list"] if v["name"] == "upstream"]
    m = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"]["query"])
    assert m, variable["query"]
    values = stack.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1)})["data"]
    assert values == [stack.sim.url]


@pytest.mark.parametrize("upstream", ["all", "one"])
@pytest.mark.parametrize("panel,expr", dashboard_targets())
def test_every_dashboard_query_returns_data(stack: Stack, panel: str, expr: str, upstream: str) -> None:
    """Each panel's query, asked as Grafana asks it (a range query over the dashboard's time range, here the
    load's start to now), draws at least one series. Gauges of the measurement window (TPOT p99 over the last
    ``window_s``) exist only while requests finish in that window, so an instant query after the load can
    rightly find nothing: the panel still plots them over the load."""
    value = ".*" if upstream == "all" else stack.sim.url
    result = stack.query_range(grafana(expr, value))
    assert result["status"] == "success", f"{panel}: {expr}\n{result.get('error')}"
    series = finite_series(result)
    if gpu_only(expr) and not nvml_gpus():
        # No NVIDIA GPU on this machine: the gateway must not invent GPU series. Where NVML sees a GPU,
        # the same expression must return data (the branch below).
        assert result["data"]["result"] == [], f"{panel}: GPU series without a GPU: {result['data']['result']}"
        return
    assert series, f"{panel}: {expr} returned no series with a finite value: {result['data']['result']}"


@pytest.mark.parametrize("alert,expr", rule_expressions())
def test_every_alert_expression_evaluates(stack: Stack, alert: str, expr: str) -> None:
    result = stack.query(expr)
    assert result["status"] == "success", f"{alert}: {expr}\n{result.get('error')}"


def test_rules_are_loaded_and_healthy(stack: Stack) -> None:
    rules = {r["name"]: r for g in stack.api("rules")["data"]["groups"] for r in g["rules"]}
    assert set(rules) == {name for name, _ in rule_expressions()}
    unhealthy = {name: r.get("lastError") for name, r in rules.items() if r["health"] != "ok"}
    assert not unhealthy, unhealthy
    # The load had far more than 5% of requests rejected for a full queue: the rejection alert's condition
    # holds on this data, so it is pending (its `for:` is minutes, longer than this test).
    rejection = rules["SweetspotRejectionRateHigh"]
    assert rejection["state"] == "pending", rejection
    # Healthy upstream, fresh backend metrics: those alerts stay quiet.
    for quiet in (
        "SweetspotUpstreamUnhealthy",
        "SweetspotNoHealthyUpstream",
        "SweetspotGatewayDown",
        "VllmDown",
        "SweetspotBackendMetricsStale",
        "SweetspotGatewayTargetAbsent",
        "SweetspotUpstreamErrorRatioHigh",
    ):
        assert rules[quiet]["state"] == "inactive", rules[quiet]


def test_promtool_checks_the_config_and_the_rules(stack: Stack) -> None:
    promtool = tool("promtool")
    for args in (
        # The file as shipped names the compose secret's path, which exists only in the container: its syntax here,
        # the whole of it (the credentials file included) in the rewritten copy the live Prometheus runs.
        ["check", "config", "--syntax-only", str(PROM_DIR / "prometheus.yml")],
        ["check", "config", str(stack.config)],
        ["check", "rules", str(PROM_DIR / "sweetspot-alerts.yml")],
        ["test", "rules", str(PROM_DIR / "tests" / "sweetspot-alerts.test.yml")],
    ):
        result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"


def test_the_images_healthcheck_command_probes_the_live_gateway(stack: Stack) -> None:
    """The Dockerfile's HEALTHCHECK, run as is: passes against the gateway, fails where none listens."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    m = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])\s*$", text, re.M)
    assert m, "no HEALTHCHECK ... CMD [...] in the Dockerfile"
    argv = json.loads(m.group(1))
    assert argv[0] == "python"
    argv[0] = sys.executable
    env = {**os.environ, "SWEETSPOT_PORT": str(stack.gateway_port)}
    assert subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode == 0
    env["SWEETSPOT_PORT"] = str(free_port())
    assert subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode != 0
