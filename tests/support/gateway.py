"""Start ``sweetspot sim`` and ``sweetspot serve`` as real processes for tests."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable

from gateway.demo.processes import LISTENING, RunningProcess, sweetspot

Start = Callable[..., RunningProcess]


def start_sim(start: Start, *args: str, time_scale: float = 1.0) -> RunningProcess:
    return start(sweetspot("sim", "--port", "0", "--time-scale", str(time_scale), *args),
                 ready_pattern=LISTENING, ready_url="{url}/health")


def start_gateway(start: Start, upstreams: list[str], *args: str, env: dict[str, str] | None = None,
                  ready: bool = True) -> RunningProcess:
    cmd = ["serve", "--port", "0", "--log-level", "warning"]
    for url in upstreams:
        cmd += ["--upstream", url]
    return start(sweetspot(*cmd, *args), ready_pattern=LISTENING,
                 ready_url="{url}/readyz" if ready else "{url}/healthz", env=env)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def metric_value(url: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """A sample's value from a Prometheus /metrics page (None if absent), parsed with prometheus-client."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                return sample.value
    return None
