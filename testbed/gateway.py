"""Start ``sweetspot sim`` and ``sweetspot serve`` as real processes for tests, and read what they answer."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from gateway.common.processes import LISTENING, RunningProcess, sweetspot

Start = Callable[..., RunningProcess]


def start_sim(start: Start, *args: str, time_scale: float = 1.0) -> RunningProcess:
    return start(
        sweetspot("sim", "--port", "0", "--time-scale", str(time_scale), *args),
        ready_pattern=LISTENING,
        ready_url="{url}/health",
    )


def start_gateway(
    start: Start, upstreams: list[str], *args: str, env: dict[str, str] | None = None, ready: bool = True
) -> RunningProcess:
    cmd = ["serve", "--port", "0", "--log-level", "warning"]
    for url in upstreams:
        cmd += ["--upstream", url]
    return start(
        sweetspot(*cmd, *args), ready_pattern=LISTENING, ready_url="{url}/readyz" if ready else "{url}/healthz", env=env
    )


def get(url: str) -> tuple[int, dict]:
    """(status, JSON body), error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def wait_for(predicate, timeout: float, what: str, interval: float = 0.02):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns something truthy (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(interval)


def assert_openai_error(error: object) -> dict:
    """An OpenAI-shaped error object: exactly message, type, param and code, with a message."""
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    return error


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
