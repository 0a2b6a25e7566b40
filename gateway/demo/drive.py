"""The demo's load, phase by phase, through the gateway: clients (closed loop, or open-loop arrivals with
``--elastic``), the simulator's speed changed through its admin endpoint as each phase says, and every
``sample_every_s`` the gateway's ``/state`` and the simulator's engine state sampled into the timeline."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from gateway.demo.joining import ElasticRun, write_upstreams_file
from gateway.demo.reference import Reference
from gateway.demo.script import Script
from gateway.demo.timeline import Sample, build_sample
from gateway.demo.view import PlainView
from gateway.sweep.client import StreamClient, Target
from gateway.sweep.live import LiveWindow
from gateway.sweep.loadgen import ClosedLoopPool, PoissonLoad
from gateway.sweep.workload import RequestFactory, Workload


class DemoError(RuntimeError):
    """The demo cannot go on (a child failed, the sweep found nothing to start from)."""


async def _get_json(http: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with http.get(url) as resp:
            return await resp.json() if resp.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


async def _get_text(http: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with http.get(url) as resp:
            return await resp.text() if resp.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
        return None


async def _no_text() -> None:
    return None


async def _set_speed(http: aiohttp.ClientSession, sim_url: str, factor: float) -> None:
    async with http.post(f"{sim_url}/admin/scenario", json={"speed_factor": factor}) as resp:
        if resp.status != 200:
            raise DemoError(f"the simulator refused speed_factor={factor}: HTTP {resp.status} {await resp.text()}")


async def drive(
    gateway_url: str,
    sim_url: str,
    model: str,
    script: Script,
    workload: Workload,
    references: list[Reference],
    view: PlainView | Any,
    samples: list[Sample],
    sample_every_s: float,
    elastic: ElasticRun | None = None,
    seed: int = 0,
) -> Any:
    """Run the phases, appending to ``samples``; returns the gateway's ``/state`` at the end."""
    target = Target(gateway_url, model=model, timeout_s=300.0)
    async with StreamClient(target) as client, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        live = LiveWindow(horizon_s=4.0)
        factory = RequestFactory(workload, stream_id=1000)
        pool: ClosedLoopPool | PoissonLoad
        if elastic is not None and script.open_loop:
            pool = PoissonLoad(client, factory, rate=elastic.arrivals[0], seed=seed, on_record=live.add)
        else:
            pool = ClosedLoopPool(client, factory, concurrency=0, on_record=live.add)
        pool.start()
        began = time.perf_counter()
        speed, planned_end = 1.0, 0.0
        try:
            for index, phase in enumerate(script.phases):
                if phase.speed_factor != speed:
                    await _set_speed(http, sim_url, phase.speed_factor)
                    speed = phase.speed_factor
                arrivals: float | None = None
                if isinstance(pool, PoissonLoad) and elastic is not None:
                    arrivals = elastic.arrivals[index]
                    pool.set_rate(arrivals)
                else:
                    pool.set_concurrency(phase.clients)
                if elastic is not None and index in elastic.joiners:
                    label, url = elastic.joiners[index]
                    elastic.listed.append(url)
                    write_upstreams_file(elastic.file, elastic.listed)
                    elastic.written_at[index] = time.perf_counter() - began
                    view.note(f"--- listed {label} ({url}) in {elastic.file}: the gateway takes it at its next check")
                view.phase_started(
                    index, phase, references[index].concurrency, time.perf_counter() - began, arrivals_per_s=arrivals
                )
                planned_end += phase.duration_s
                next_tick = time.perf_counter()
                while time.perf_counter() - began < planned_end:
                    state, backend, metrics = await asyncio.gather(
                        _get_json(http, f"{gateway_url}/state"),
                        _get_json(http, f"{sim_url}/admin/scenario"),
                        _get_text(http, f"{gateway_url}/metrics") if elastic is not None else _no_text(),
                    )
                    now = time.perf_counter()
                    stats = pool.stats()
                    live.observe(now, stats)
                    sample = build_sample(
                        now - began,
                        index,
                        state,
                        backend,
                        live.snapshot(now),
                        stats,
                        arrivals_per_s=arrivals,
                        labels=elastic.labels if elastic is not None else None,
                        metrics=metrics,
                        model=elastic.model if elastic is not None else None,
                    )
                    samples.append(sample)
                    view.update(sample)
                    next_tick += sample_every_s
                    await asyncio.sleep(max(0.0, min(next_tick, began + planned_end) - time.perf_counter()))
            final = await _get_json(http, f"{gateway_url}/state")
        finally:
            await pool.stop(drain_timeout_s=0)
    return final
