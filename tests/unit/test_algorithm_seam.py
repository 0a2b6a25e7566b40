"""The ``algorithm`` setting: another limit algorithm in the controller's place, by a built-in name or an import
path.

What it must hold to: a bad path or an unknown name is one clear error before the gateway starts; every
built-in name builds its baseline with its reference's defaults (``static``: the limit the gateway starts
at); the algorithm's limit reaches the limiter within the gateway's bounds; and an algorithm that learns per
request (the threshold gate) hears of each request as it ends *before* its permit is handed on, so a shut
gate stays shut, as its docstring requires. The control loop runs against a real HTTP server publishing
vLLM's metrics on loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from pydantic import ValidationError

from gateway.control.algorithm import Action, RequestObserver
from gateway.control.baselines import (
    BUILT_IN,
    AimdLatencyLimit,
    EnvoyGradient,
    Gradient2Limit,
    StaticLimit,
    ThresholdGate,
    VegasLimit,
)
from gateway.control.observation import Headroom, LimiterState, Observation, observe
from gateway.control.window import Outcome, RequestSample, SlidingWindow
from gateway.server.admission.admission_queue import AdmissionQueue
from gateway.server.admission.limiter import Limiter
from gateway.server.feedback.algorithm_path import load_factory
from gateway.server.feedback.control_loop import ControlLoop
from gateway.server.parts import Gateway
from gateway.settings import Settings
from gateway.sweep.result import save_sweep_result
from testbed.loopback import serving
from tests.unit.test_start_points import sweep

THRESHOLD = "gateway.control.baselines.threshold:ThresholdGate"


# --- the setting --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["gateway.control.baselines.threshold", "a:b:c", ":ThresholdGate", "a b:c", "m:"])
def test_a_path_not_of_the_form_module_factory_is_refused(value: str) -> None:
    with pytest.raises(ValidationError, match="module:factory"):
        Settings(algorithm=value)


def test_the_path_comes_from_the_environment_like_every_knob(monkeypatch) -> None:
    monkeypatch.setenv("SWEETSPOT_ALGORITHM", THRESHOLD)
    assert Settings().algorithm == THRESHOLD


def test_an_algorithm_without_the_control_loop_is_refused() -> None:
    with pytest.raises(ValidationError, match="needs the control loop"):
        Settings(algorithm=THRESHOLD, control_enabled=False)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("testbed.no_such_module:Thing", "cannot import 'testbed.no_such_module'"),
        ("gateway.control.baselines.threshold:NoSuchGate", "has no attribute 'NoSuchGate'"),
        ("gateway.control.baselines.threshold:QUEUE_DEPTH_THRESHOLD", "is a int, not a factory"),
    ],
)
def test_an_unusable_path_says_what_is_wrong_when_imported(path: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        load_factory(path)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("gateway.control.baselines.static:StaticLimit", "calling it with no arguments failed"),
        ("collections:OrderedDict", "not a limit algorithm"),
    ],
)
def test_a_factory_that_builds_no_algorithm_says_so_when_called(path: str, why: str) -> None:
    factory = load_factory(path)
    with pytest.raises(ValueError, match=why):
        factory(8)


def test_a_good_path_builds_a_fresh_algorithm_per_call() -> None:
    factory = load_factory(THRESHOLD)
    first, second = factory(8), factory(8)
    assert isinstance(first, ThresholdGate) and isinstance(second, ThresholdGate) and first is not second


# --- the built-in names ---------------------------------------------------------------------------------
def observation(now: float) -> Observation:
    return observe(now, SlidingWindow(10.0).stats(now), LimiterState(8, 4, 4, 2), Headroom())


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_every_built_in_name_builds_a_limit_algorithm_that_steps(name: str) -> None:
    """Through the setting and the loader, as the gateway does; each a fresh one, stepping on an observation."""
    factory = load_factory(Settings(algorithm=f" {name} ").algorithm or "")
    algorithm, other = factory(12), factory(12)
    assert algorithm is not other and isinstance(algorithm.limit, int)
    decision = algorithm.step(observation(1.0))
    assert decision.limit == algorithm.limit and isinstance(algorithm.state(), dict)
    if isinstance(algorithm, RequestObserver):
        assert isinstance(algorithm.on_request(1.5, ended(1.5), 4, 3), int)


def test_the_built_ins_are_the_baselines_with_their_published_defaults() -> None:
    built = {name: load_factory(name)(12) for name in BUILT_IN}
    assert {name: type(a) for name, a in built.items()} == {
        "static": StaticLimit,
        "gie-threshold": ThresholdGate,
        "envoy-gradient": EnvoyGradient,
        "netflix-gradient2": Gradient2Limit,
        "netflix-vegas": VegasLimit,
        "netflix-aimd": AimdLatencyLimit,
    }
    # Only static takes the gateway's starting limit; the others start where their references say.
    assert {name: a.limit for name, a in built.items()} == {
        "static": 12,
        "gie-threshold": 0,
        "envoy-gradient": 3,
        "netflix-gradient2": 20,
        "netflix-vegas": 20,
        "netflix-aimd": 20,
    }


def test_the_settings_description_names_every_built_in() -> None:
    """The description is the flag's help, the variable's and the TOML key's documentation."""
    description = Settings.model_fields["algorithm"].description or ""
    assert [name for name in BUILT_IN if f"`{name}`" not in description] == []


@pytest.mark.parametrize("value", ["vegas", "Static", "netflix_vegas"])
def test_an_unknown_name_lists_the_built_ins(value: str) -> None:
    with pytest.raises(ValidationError, match=r"neither a built-in algorithm \(static, gie-threshold"):
        Settings(algorithm=value)
    with pytest.raises(ValueError, match="neither a built-in"):
        load_factory(value)


@pytest.mark.parametrize(("swept", "held"), [(False, 40), (True, 32)])
async def test_static_holds_the_limit_the_gateway_starts_at(backend, tmp_path: Path, swept: bool, held: int) -> None:
    """Without a sweep result, initial_limit (within limit_max); with one, its sweet spot for the upstream:
    what ``--no-control`` holds, with the control loop's decisions, metrics and state view."""
    _, url = backend
    result = save_sweep_result(sweep(url), tmp_path / "sweep.json") if swept else None
    settings = Settings(upstreams=[url], algorithm="static", initial_limit=300, limit_max=40, sweep_result=result)
    gateway = Gateway.build(settings)
    try:
        loop = ControlLoop.build(gateway)
        upstream = gateway.pool.by_name[url]
        assert upstream.limiter.limit == held
        for now in (1.0, 3.0):
            decision = loop.tick_one(upstream, loop.controls[url], now)
            assert (decision.limit, decision.action) == (held, Action.HOLD) and upstream.limiter.limit == held
        assert loop.controls[url].state()["algorithm"] == {"algorithm": "static", "limit": held}
    finally:
        await gateway.client.close()


# --- a request's end reaches the limiter before its permit is handed on --------------------------------
def ended(at: float = 1.0) -> RequestSample:
    return RequestSample(
        arrived=0.0, admitted=0.0, finished=at, first_token=0.5, prompt_tokens=8, output_tokens=8, outcome=Outcome.OK
    )


class _Target:
    def __init__(self, limit: int) -> None:
        self.name, self.limiter, self.healthy = "a", Limiter("a", limit), True


async def test_the_end_listener_runs_between_the_release_and_the_dispatch() -> None:
    target = _Target(limit=2)
    queue = AdmissionQueue([target], max_queue=10, clock=lambda: 0.0)
    first = await queue.acquire(timeout_s=1)
    second = await queue.acquire(timeout_s=1)
    heard: list[tuple[int, int]] = []

    def shut(sample: RequestSample, inflight_at_start: int, inflight: int) -> None:
        heard.append((inflight_at_start, inflight))
        target.limiter.set_limit(max(inflight, 1))

    target.limiter.on_end = shut
    waiting = asyncio.create_task(queue.acquire(timeout_s=5))
    await asyncio.sleep(0)
    queue.release(second, ended())
    await asyncio.sleep(0)
    assert heard == [(2, 1)]  # admitted second (2 in flight), 1 left now
    assert not waiting.done() and queue.depth == 1  # the slot went with the ending request
    queue.release(first)  # no sample: it never reached the upstream, and nobody is told
    assert heard == [(2, 1)]
    await asyncio.wait_for(waiting, 1)
    queue.release(waiting.result())


# --- the control loop with the threshold gate, against a server publishing vLLM's metrics ----------------
class Backend:
    """vLLM's gauges as the gate reads them; set between scrapes."""

    def __init__(self) -> None:
        self.kv_usage, self.waiting = 0.1, 0

    async def metrics(self, request: web.Request) -> web.Response:
        text = (
            f"vllm:num_requests_running 1\nvllm:num_requests_waiting {self.waiting}\n"
            f"vllm:kv_cache_usage_perc {self.kv_usage}\n"
        )
        return web.Response(text=text, content_type="text/plain")


@pytest.fixture
async def backend() -> AsyncIterator[tuple[Backend, str]]:
    state = Backend()
    app = web.Application()
    app.router.add_get("/metrics", state.metrics)
    async with serving(app) as url:
        yield state, url


async def test_the_threshold_gate_drives_the_limiter_as_its_docstring_says(backend) -> None:
    state, url = backend
    settings = Settings(
        upstreams=[url],
        algorithm=THRESHOLD,
        backend="vllm",
        control_interval_s=0.05,
        metrics_interval_s=0.05,
        limit_max=64,
    )
    gateway = Gateway.build(settings)
    loop = ControlLoop.build(gateway)
    upstream = gateway.pool.by_name[url]
    limiter, queue = upstream.limiter, gateway.queue
    control = loop.controls[url]
    assert isinstance(control.algorithm, ThresholdGate)
    assert limiter.limit == 1  # the gate starts shut at 0; the limiter holds no limit under limit_min
    assert limiter.on_end is not None
    loop.start()
    try:
        await loop.scrape()
        held = [await queue.acquire(timeout_s=1)]
        waiters = [asyncio.create_task(queue.acquire(timeout_s=5)) for _ in range(5)]
        await asyncio.sleep(0)
        assert queue.depth == 5
        # A fresh reading under the thresholds opens the gate: everyone waiting goes through.
        await loop.control()
        assert control.algorithm.open and limiter.limit == 6
        await asyncio.sleep(0)
        assert queue.depth == 0 and limiter.inflight == 6
        held += await asyncio.wait_for(asyncio.gather(*waiters), 1)
        # KV usage at 0.8 shuts it: nobody new, and a request that ends takes its slot with it.
        state.kv_usage = 0.85
        await loop.scrape()
        await loop.control()
        assert not control.algorithm.open and limiter.limit == 6
        late = asyncio.create_task(queue.acquire(timeout_s=5))
        await asyncio.sleep(0)
        queue.release(held.pop(), ended())
        await asyncio.sleep(0)
        assert limiter.limit == 5 and limiter.inflight == 5 and not late.done()
        # The backend's own queue at 5 keeps it shut with KV usage low again.
        state.kv_usage, state.waiting = 0.1, 5
        await loop.scrape()
        await loop.control()
        assert not control.algorithm.open and not late.done()
        # Both under their thresholds: open, and the late arrival goes through.
        state.waiting = 4
        await loop.scrape()
        await loop.control()
        assert control.algorithm.open
        held.append(await asyncio.wait_for(late, 1))
        for permit in held:
            queue.release(permit, ended())
        assert limiter.inflight == 0
    finally:
        await gateway.client.close()


async def test_stale_metrics_shut_the_gate(backend) -> None:
    """GIE counts a pod whose metrics are older than 200 ms as saturated: a scrape that stopped is a shut gate."""
    _, url = backend
    now = [100.0]
    settings = Settings(
        upstreams=[url], algorithm=THRESHOLD, backend="vllm", control_interval_s=0.05, metrics_interval_s=0.05
    )
    gateway = Gateway.build(settings, clock=lambda: now[0])
    loop = ControlLoop.build(gateway)
    control = loop.controls[url]
    loop.start()
    try:
        await loop.scrape()
        await loop.control()
        assert control.algorithm.state()["open"]
        now[0] += 0.25
        await loop.control()
        assert not control.algorithm.state()["open"]
    finally:
        await gateway.client.close()


async def test_the_limit_an_algorithm_asks_for_is_held_within_the_gateway_bounds(backend) -> None:
    _, url = backend
    settings = Settings(upstreams=[url], algorithm="testbed.algorithms:Wild", limit_min=2, limit_max=10)
    gateway = Gateway.build(settings)
    loop = ControlLoop.build(gateway)
    upstream = gateway.pool.by_name[url]
    assert upstream.limiter.limit == 10  # it starts at 1000
    control = loop.controls[url]
    try:
        decision = loop.tick_one(upstream, control, 1.0)
        assert decision.limit == 0 and upstream.limiter.limit == 2
    finally:
        await gateway.client.close()
