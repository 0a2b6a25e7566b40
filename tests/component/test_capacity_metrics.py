"""The capacity signal in the running gateway (docs/deploy.md, "The capacity signal"): nothing is exported before
a backend has been measured at its limit in steady state (its request turned over, then a window spent at the
limit), and after that every figure is, labelled by model.

The control loop is ticked by the test (``control_interval_s`` is an hour), so it sees the states the test makes:
one slot (``limit_max`` 1 holds it there), requests queued behind it for longer than the window."""

from __future__ import annotations

import asyncio

from tests.component.conftest import MODEL, Gate, Stage, hang, until

WINDOW_S = 0.3


async def test_capacity_figures_appear_once_a_backend_was_measured_at_its_limit(stage: Stage) -> None:
    gates = [Gate() for _ in range(4)]
    upstream = await stage.upstream()
    upstream.then(*(hang(gate) for gate in gates))
    gw = await stage.gateway(
        upstream,
        control_enabled=True,
        control_interval_s=3600,
        initial_limit=1,
        limit_min=1,
        limit_max=1,
        window_s=WINDOW_S,
        target_utilisation=0.5,
    )
    loop = gw.app.app.state.control_loop
    exchanges = [gw.chat() for _ in gates[:3]]
    await until(lambda: gw.parts.queue.depth == 2)
    await loop.control()
    # limit bound, but not for a whole window yet: no capacity, no desired count; the demand is known after a tick
    assert gw.parts.metrics.registry.get_sample_value("sweetspot_upstreams_desired", {"model": MODEL}) is None
    assert (
        gw.parts.metrics.registry.get_sample_value("sweetspot_pool_capacity_tokens_per_second", {"model": MODEL})
        is None
    )
    assert gw.metric("sweetspot_upstreams_serving", model=MODEL) == 1
    await asyncio.sleep(WINDOW_S)
    gates[0].open()
    await exchanges[0].done()
    await until(lambda: gw.parts.queue.depth == 1)
    await loop.control()
    # the limit has bound for a window, and the window holds a completion, but its request started before the
    # window: the slot has only now turned over, steady from here; nothing yet
    assert (
        gw.parts.metrics.registry.get_sample_value("sweetspot_pool_capacity_requests_per_second", {"model": MODEL})
        is None
    )
    await asyncio.sleep(WINDOW_S * 0.6)
    await loop.control()  # a tick inside the next one's window: the demand's base
    exchanges.append(gw.chat())  # one arrival since
    await until(lambda: gw.parts.queue.depth == 2)
    await asyncio.sleep(WINDOW_S * 0.6)  # a whole window since the turnover
    gates[1].open()
    await exchanges[1].done()
    await until(lambda: gw.parts.queue.depth == 1)
    await loop.control()
    labels = {"upstream": upstream.url, "model": MODEL}
    assert gw.metric("sweetspot_upstream_capacity_requests_per_second", **labels) > 0
    assert (
        gw.parts.metrics.registry.get_sample_value("sweetspot_upstream_capacity_tokens_per_second", labels) is not None
    )
    assert gw.metric("sweetspot_pool_capacity_requests_per_second", model=MODEL) == gw.metric(
        "sweetspot_upstream_capacity_requests_per_second", **labels
    )
    assert gw.metric("sweetspot_demand_requests_per_second", model=MODEL) > 0
    # the one backend is at its limit with a request waiting: at least one more is wanted
    assert gw.metric("sweetspot_upstreams_desired", model=MODEL) >= 2
    for gate, exchange in zip(gates[2:], exchanges[2:], strict=True):
        gate.open()
        await exchange.done()
    gw.assert_settled()
