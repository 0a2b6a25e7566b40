"""One row of the demo's timeline, built from what the gateway, the simulator and the clients report.

Three sources, read every sample tick: the gateway's ``GET /state`` (limit, in-flight, queue, its
sliding window's tokens/s and p99 latencies, and the controller's state when it has one), the
simulator's ``GET /admin/scenario`` (what the backend itself runs: running, waiting, KV usage,
preemptions) and the demo's own load generator (client-side tokens/s, requests that failed or were
refused). Every field is read defensively: a missing or renamed field becomes ``None``, never an
exception, so the demo keeps running against a gateway whose state view grows or changes.

The elastic variant reads two more things each tick: every upstream's entry of ``/state`` (not only the
first), and the capacity signal's gauges from the gateway's ``/metrics`` (the signal is exported there and
nowhere else), each upstream named by the demo's own label for it (``backend-1``, ``backend-2``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway.sweep.live import LiveStats
from gateway.sweep.loadgen import PoolStats


@dataclass(frozen=True, slots=True)
class UpstreamSample:
    """One upstream of the gateway at one tick (elastic variant)."""

    label: str  # the demo's name for it, e.g. backend-2
    url: str
    healthy: bool | None
    retiring: bool | None
    limit: int | None
    inflight: int | None
    tokens_per_s: float | None  # the gateway window's output tokens/s for this upstream
    capacity_requests_per_s: float | None  # sweetspot_upstream_capacity_requests_per_second, once measured
    capacity_tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class SignalSample:
    """The capacity signal of the demo's model at one tick, from the gateway's /metrics; None: absent there."""

    desired: int | None  # sweetspot_upstreams_desired
    serving: int | None  # sweetspot_upstreams_serving
    demand_requests_per_s: float | None  # sweetspot_demand_requests_per_second
    pool_requests_per_s: float | None  # sweetspot_pool_capacity_requests_per_second: one backend, the median
    pool_tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the load began
    phase: int  # index into the script's phases
    clients: int
    limit: int | None
    inflight: int | None
    queued: int | None
    tokens_per_s: float | None  # client-side: streamed chunks per second (one token each)
    gateway_tokens_per_s: float | None  # the gateway window's output tokens/s
    ttft_p99_ms: float | None  # backend TTFT (from admission), the gateway window's p99
    client_ttft_p99_ms: float | None  # TTFT as clients saw it, the gateway queue included
    tpot_p99_ms: float | None
    backend_running: int | None
    backend_waiting: int | None
    kv_usage: float | None
    preemptions: int | None
    ok: int  # client requests that finished well, since the load began
    failed: int  # ... that failed (errors)
    rejected: int  # ... that the gateway refused (429/503)
    action: str | None = None  # the controller's last decision, when it has one
    reason: str | None = None
    last_move: str | None = None  # the controller's last limit change, e.g. "decrease 24->18 (knee)"
    arrivals_per_s: float | None = None  # open loop: the Poisson rate the clients sent at
    upstreams: tuple[UpstreamSample, ...] = ()  # elastic variant: every upstream of /state
    signal: SignalSample | None = None  # elastic variant: the capacity signal

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    number = _num(value)
    return None if number is None else int(number)


def _ms(seconds: Any) -> float | None:
    value = _num(seconds)
    return None if value is None else value * 1000.0


def upstream_state(state: Any) -> dict[str, Any]:
    """The first upstream's entry of a ``/state`` document (the demo has exactly one)."""
    upstreams = _get(state, "upstreams")
    return upstreams[0] if isinstance(upstreams, list) and upstreams and isinstance(upstreams[0], dict) else {}


def last_decision(state: Any) -> tuple[str | None, str | None]:
    decision = _get(upstream_state(state), "controller", "last_decision")
    action, reason = _get(decision, "action"), _get(decision, "reason")
    return (str(action) if action is not None else None, str(reason) if reason is not None else None)


def last_move(state: Any) -> str | None:
    """The newest entry of the controller's decision log that moved the limit, as one short string."""
    log = _get(upstream_state(state), "controller", "decisions")
    if not isinstance(log, list):
        return None
    for entry in reversed(log):
        if isinstance(entry, dict) and entry.get("action") not in (None, "hold"):
            return f"{entry.get('action')} {entry.get('previous')}->{entry.get('limit')} ({entry.get('reason')})"
    return None


def build_sample(
    t: float,
    phase: int,
    state: Any,
    backend: Any,
    live: LiveStats,
    pool: PoolStats,
    *,
    arrivals_per_s: float | None = None,
    labels: Mapping[str, str] | None = None,
    metrics: str | None = None,
    model: str | None = None,
) -> Sample:
    """A timeline row from one ``/state`` document, one ``/admin/scenario`` view and the client stats; with
    ``labels`` (the elastic variant) also every upstream and the capacity signal read from ``metrics``."""
    upstream = upstream_state(state)
    window = _get(upstream, "window")
    limit = _int(_get(upstream, "controller", "limit"))
    if limit is None:
        limit = _int(_get(upstream, "limit"))
    action, reason = last_decision(state)
    signal = read_signal(metrics, model) if labels is not None else {}
    return Sample(
        t=round(t, 3),
        phase=phase,
        clients=pool.concurrency,
        limit=limit,
        inflight=_int(_get(upstream, "inflight")),
        queued=_int(_get(state, "queue", "depth")),
        tokens_per_s=round(live.chunks_per_s, 1),
        gateway_tokens_per_s=_num(_get(window, "output_tokens_per_s")),
        ttft_p99_ms=_ms(_get(window, "upstream_ttft_p99")),
        client_ttft_p99_ms=_ms(_get(window, "ttft_p99")),
        tpot_p99_ms=_ms(_get(window, "tpot_p99")),
        backend_running=_int(_get(backend, "num_running")),
        backend_waiting=_int(_get(backend, "num_waiting")),
        kv_usage=_num(_get(backend, "kv_usage")),
        preemptions=_int(_get(backend, "num_preemptions")),
        ok=pool.ok,
        failed=pool.failed,
        rejected=pool.rejected,
        action=action,
        reason=reason,
        last_move=last_move(state),
        arrivals_per_s=arrivals_per_s,
        upstreams=() if labels is None else upstream_samples(state, labels, signal),
        signal=None if labels is None else signal_sample(signal),
    )


#: The capacity signal's gauges the elastic demo reads: (metric family, per upstream).
SIGNAL_FAMILIES = {
    "sweetspot_upstreams_desired": False,
    "sweetspot_upstreams_serving": False,
    "sweetspot_demand_requests_per_second": False,
    "sweetspot_pool_capacity_requests_per_second": False,
    "sweetspot_pool_capacity_tokens_per_second": False,
    "sweetspot_upstream_capacity_requests_per_second": True,
    "sweetspot_upstream_capacity_tokens_per_second": True,
}


def read_signal(text: str | None, model: str | None) -> dict[str, dict[str, float]]:
    """The capacity signal's gauges in a ``/metrics`` exposition, for ``model`` (any model when None):
    ``{family: {"": value}}`` for the per-model ones, ``{family: {upstream: value}}`` for the per-upstream
    ones. A gauge absent (not measured yet), not finite, or an exposition that does not parse: left out."""
    found: dict[str, dict[str, float]] = {}
    if not text:
        return found
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return found
    for family in families:
        per_upstream = SIGNAL_FAMILIES.get(family.name)
        if per_upstream is None:
            continue
        for sample in family.samples:
            if model is not None and sample.labels.get("model") != model:
                continue
            if not math.isfinite(sample.value):
                continue
            key = sample.labels.get("upstream", "") if per_upstream else ""
            found.setdefault(family.name, {})[key] = float(sample.value)
    return found


def signal_sample(signal: Mapping[str, Mapping[str, float]]) -> SignalSample:
    def one(family: str) -> float | None:
        return signal.get(family, {}).get("")

    desired, serving = one("sweetspot_upstreams_desired"), one("sweetspot_upstreams_serving")
    return SignalSample(
        desired=None if desired is None else int(desired),
        serving=None if serving is None else int(serving),
        demand_requests_per_s=one("sweetspot_demand_requests_per_second"),
        pool_requests_per_s=one("sweetspot_pool_capacity_requests_per_second"),
        pool_tokens_per_s=one("sweetspot_pool_capacity_tokens_per_second"),
    )


def upstream_samples(
    state: Any, labels: Mapping[str, str], signal: Mapping[str, Mapping[str, float]]
) -> tuple[UpstreamSample, ...]:
    """Every upstream ``/state`` lists, named by ``labels`` (url -> label; an unknown url is its own label)."""
    upstreams = _get(state, "upstreams")
    if not isinstance(upstreams, list):
        return ()
    out = []
    for entry in upstreams:
        url = _get(entry, "url")
        if not isinstance(url, str):
            continue
        limit = _int(_get(entry, "controller", "limit"))
        healthy, retiring = _get(entry, "healthy"), _get(entry, "retiring")
        out.append(
            UpstreamSample(
                label=labels.get(url, url),
                url=url,
                healthy=healthy if isinstance(healthy, bool) else None,
                retiring=retiring if isinstance(retiring, bool) else None,
                limit=limit if limit is not None else _int(_get(entry, "limit")),
                inflight=_int(_get(entry, "inflight")),
                tokens_per_s=_num(_get(entry, "window", "output_tokens_per_s")),
                capacity_requests_per_s=signal.get("sweetspot_upstream_capacity_requests_per_second", {}).get(url),
                capacity_tokens_per_s=signal.get("sweetspot_upstream_capacity_tokens_per_second", {}).get(url),
            )
        )
    return tuple(out)
