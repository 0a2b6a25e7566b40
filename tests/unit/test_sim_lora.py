"""The simulator's multi-LoRA model (gateway.sim.lora, the engine's rules, the metric and the HTTP routes).

vLLM's rules it keeps: at most ``max_loras`` distinct adapters in a batch, a request for another one skipped
(keeping its place) while those behind it may run; resident adapters least recently used out beyond
``max_cpu_loras``; a load lengthens the step that needs it; ``vllm:lora_requests_info`` set to the current time
under the label set of the running and waiting adapters. Virtual time for the engine; the HTTP app in process.
"""

from __future__ import annotations

import httpx
import pytest

from gateway.sim.engine import Engine
from gateway.sim.exposition import LORA_INFO_SERIES_KEPT, VllmMetrics
from gateway.sim.http_app import SimConfig, create_sim_app
from gateway.sim.lora import AdapterCache, LoraConfig, parse_lora_module
from gateway.sim.profiles import LLAMA31_8B_24GB
from gateway.telemetry.backends.parse import parse_samples, vllm_lora_state

PROFILE = LLAMA31_8B_24GB
BASE = PROFILE.model


def lora(*names: str, max_loras: int = 1, max_cpu_loras: int | None = None, load_s: float = 0.04) -> LoraConfig:
    return LoraConfig(tuple((n, f"/adapters/{n}") for n in names), max_loras, max_cpu_loras, load_s)


def drain(engine: Engine, now: float = 0.0) -> list:
    steps = []
    while (at := engine.next_step_at(now)) is not None:
        res = engine.step(at)
        assert res is not None
        steps.append(res)
        now = res.end
    return steps


# --- the adapter cache ---------------------------------------------------------------------------------------------


def test_registered_adapters_are_resident_least_recently_used_out() -> None:
    cache = AdapterCache(lora("a", "b", "c", max_loras=1, max_cpu_loras=2))
    assert cache.adapters() == [("a", "/adapters/a"), ("b", "/adapters/b"), ("c", "/adapters/c")]
    assert cache.resident() == ["b", "c"] and cache.loads_total == 0  # registration loads, uncounted
    assert cache.activate(["b"]) == 0.0 and cache.resident() == ["c", "b"]
    assert cache.activate(["a"]) == pytest.approx(0.04) and cache.loads_total == 1
    assert cache.resident() == ["b", "a"]  # c was the least recently used
    assert not cache.register("a", "/x") and cache.unregister("a") and not cache.unregister("a")
    assert "a" not in cache and "b" in cache


def test_a_batch_never_evicts_its_own_adapters() -> None:
    cache = AdapterCache(lora("a", "b", "c", max_loras=2, max_cpu_loras=2))
    cost = cache.activate(["a", "b"])  # a was evicted at registration; b resident
    assert cost == pytest.approx(0.04) and sorted(cache.resident()) == ["a", "b"]


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (LoraConfig(max_loras=0), "max_loras"),
        (LoraConfig(max_loras=4, max_cpu_loras=2), "max_cpu_loras"),
        (LoraConfig(load_s=-1.0), "load cost"),
        (LoraConfig((("a", "p"), ("a", "q"))), "unique"),
    ],
)
def test_bad_configurations_are_refused(config: LoraConfig, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        config.validate()


def test_lora_module_specs() -> None:
    assert parse_lora_module("sql=/data/sql-lora") == ("sql", "/data/sql-lora")
    assert parse_lora_module("plain") == ("plain", "plain")
    with pytest.raises(ValueError):
        parse_lora_module("=/path")


# --- the engine ----------------------------------------------------------------------------------------------------


def test_max_loras_holds_another_adapter_back_and_lets_the_ones_behind_it_run() -> None:
    engine = Engine(PROFILE, lora=lora("a", "b", max_loras=1, max_cpu_loras=2))
    first = engine.submit(100, 20, 0.0, ignore_eos=True, lora="a")
    cold = engine.submit(100, 20, 0.0, ignore_eos=True, lora="b")
    same = engine.submit(100, 20, 0.0, ignore_eos=True, lora="a")
    base = engine.submit(100, 20, 0.0, ignore_eos=True)  # the base model takes no adapter slot
    step = engine.step(0.0)
    assert step is not None
    assert sorted(engine.running_ids()) == sorted([first, same, base])
    assert engine.waiting_ids() == [cold]  # skipped, still first in line
    assert engine.running_adapters() == ["a"] and engine.waiting_adapters() == ["b"]
    drain(engine, step.end)
    a_done = max(engine.seq(first).finished_at, engine.seq(same).finished_at)
    assert engine.seq(cold).scheduled_at >= a_done  # only once no request of a runs


def test_a_non_resident_adapter_costs_its_step_the_load_time() -> None:
    engine = Engine(PROFILE, lora=lora("a", "b", max_loras=1, max_cpu_loras=1, load_s=0.05))  # only b resident
    engine.submit(100, 4, 0.0, ignore_eos=True, lora="a")
    steps = drain(engine)
    assert steps[0].lora_load_s == pytest.approx(0.05)
    assert steps[0].duration == pytest.approx(PROFILE.step_time(0, 100, 100) + 0.05)
    assert all(s.lora_load_s == 0.0 for s in steps[1:])
    assert engine.adapters is not None and engine.adapters.loads_total == 1
    engine.submit(100, 4, steps[-1].end, ignore_eos=True, lora="a")  # resident now: no load
    assert all(s.lora_load_s == 0.0 for s in drain(engine, steps[-1].end))
    assert engine.adapters.loads_total == 1


def test_unknown_adapter_and_no_lora_are_refused() -> None:
    with pytest.raises(ValueError, match="not served"):
        Engine(PROFILE, lora=lora("a")).submit(10, 1, 0.0, lora="zzz")
    with pytest.raises(ValueError, match="not served"):
        Engine(PROFILE).submit(10, 1, 0.0, lora="a")


def test_swapping_adapters_on_one_slot_loads_each_time() -> None:
    """Alternating adapters with one slot and one resident: every switch is a load (the thrash affinity avoids)."""
    engine = Engine(PROFILE, lora=lora("a", "b", max_loras=1, max_cpu_loras=1))
    now = 0.0
    for name in ["a", "b", "a", "b"]:
        engine.submit(50, 2, now, ignore_eos=True, lora=name)
        now = drain(engine, now)[-1].end
    assert engine.adapters is not None and engine.adapters.loads_total == 4


# --- the metric ---------------------------------------------------------------------------------------------------


def test_lora_requests_info_is_vllms_gauge_and_the_newest_set_wins() -> None:
    clock = iter(float(t) for t in range(1000, 2000))
    metrics = VllmMetrics(PROFILE, BASE, max_loras=2, wall_clock=lambda: next(clock))
    metrics.set_lora(["a"], [])
    metrics.set_lora(["a", "b"], ["c"])
    page = metrics.render().decode()
    assert 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"}' in page
    state = vllm_lora_state(parse_samples(page))
    assert state is not None and (state.running, state.waiting, state.max_lora) == (("a", "b"), ("c",), 2)
    for i in range(LORA_INFO_SERIES_KEPT + 10):
        metrics.set_lora([f"x{i}"], [])
    kept = parse_samples(metrics.render().decode())["vllm:lora_requests_info"]
    assert len(kept) == LORA_INFO_SERIES_KEPT


def test_without_lora_there_is_no_lora_series() -> None:
    page = VllmMetrics(PROFILE, BASE).render().decode()
    assert "lora" not in page


# --- HTTP ----------------------------------------------------------------------------------------------------------


async def test_models_requests_and_runtime_loading_over_http() -> None:
    app = create_sim_app(SimConfig(PROFILE, time_scale=50.0, lora=lora("sql", max_loras=2)))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://sim") as http:
        listed = (await http.get("/v1/models")).json()["data"]
        assert [(m["id"], m["parent"], m["root"]) for m in listed] == [
            (BASE, None, PROFILE.model),
            ("sql", BASE, "/adapters/sql"),
        ]
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        answer = await http.post("/v1/chat/completions", json={"model": "sql", **chat})
        assert answer.status_code == 200 and answer.json()["model"] == "sql"
        assert (await http.post("/v1/chat/completions", json={"model": "math", **chat})).status_code == 404

        loaded = await http.post("/v1/load_lora_adapter", json={"lora_name": "math", "lora_path": "/a/math"})
        assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'math' added successfully."
        again = await http.post("/v1/load_lora_adapter", json={"lora_name": "math", "lora_path": "/a/math"})
        assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
        assert (await http.post("/v1/load_lora_adapter", json={"lora_name": "x"})).status_code == 400
        assert (await http.post("/v1/chat/completions", json={"model": "math", **chat})).json()["model"] == "math"

        assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "math"})).status_code == 200
        gone = await http.post("/v1/unload_lora_adapter", json={"lora_name": "math"})
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "NotFoundError"
        assert "math" not in [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
        page = (await http.get("/metrics")).text
        state = vllm_lora_state(parse_samples(page))
        assert state is not None and state.max_lora == 2 and state.running == ()
        assert "sweetspot_sim_lora_loads_total" in page


async def test_without_lora_the_routes_are_absent() -> None:
    app = create_sim_app(SimConfig(PROFILE, time_scale=50.0))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://sim") as http:
        assert (await http.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "b"})).status_code == 404
        assert [m["parent"] for m in (await http.get("/v1/models")).json()["data"]] == [None]
