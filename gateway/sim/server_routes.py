"""The simulator's routes that change the server rather than generate: vLLM's run-time LoRA adapter endpoints,
and (only when the app is built with ``admin=True``) the scenario knobs a test or the demo turns under a running
client (slower, a smaller KV cache, failing, stalled)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gateway.sim.engine import Engine
from gateway.sim.protocol import BadRequest
from gateway.sim.request_bodies import read_json_object
from gateway.sim.runner import EngineRunner


def add_lora_routes(app: FastAPI, engine: Engine) -> None:
    """vLLM's run-time adapter endpoints (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), with its bodies, answers and
    errors: 200 with a plain-text sentence, 400 for a missing field or a name already loaded, 404 for unloading a
    name not loaded."""
    adapters = engine.adapters
    assert adapters is not None

    def error(message: str, kind: str, status: int) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        body = await read_json_object(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            return error("Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400)
        if not adapters.register(name, path):
            return error(f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput", 400)
        return Response(f"Success: LoRA adapter '{name}' added successfully.", 200)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        body = await read_json_object(request)
        name = body.get("lora_name")
        if not name or not isinstance(name, str):
            return error("'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput", 400)
        if not adapters.unregister(name):
            return error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
        return Response(f"Success: LoRA adapter '{name}' removed successfully.", 200)


def add_admin_routes(app: FastAPI, engine: Engine, runner: Callable[[], EngineRunner]) -> None:
    """Scenario knobs over HTTP. Stalls are given in wall seconds from now; the rest is unitless."""

    def view() -> dict[str, Any]:
        r: EngineRunner = runner()
        sc = dataclasses.asdict(engine.scenario)
        stall_left = max(0.0, r.to_wall(sc.pop("stalled_until") - r.vnow()))
        return sc | {
            "stall_remaining_s": stall_left,
            "time_scale": r.time_scale,
            "profile": engine.profile.name,
            "kv_blocks_total": engine.total_blocks,
            "kv_blocks_used": engine.used_blocks,
            "kv_usage": engine.kv_usage,
            "num_running": engine.num_running,
            "num_waiting": engine.num_waiting,
            "num_preemptions": engine.num_preemptions,
            "lag_resets": r.lag_resets,
        }

    @app.get("/admin/scenario")
    async def get_scenario() -> Response:
        return JSONResponse(view())

    @app.post("/admin/scenario")
    async def set_scenario(request: Request) -> Response:
        body = await read_json_object(request)
        known = {"reset", "speed_factor", "kv_fraction", "max_num_seqs", "error_rate", "error_status", "stall_s"}
        unknown = sorted(set(body) - known)
        if unknown:
            raise BadRequest(f"unknown scenario knobs: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        r: EngineRunner = runner()
        if body.get("reset"):
            engine.reset_scenario()
        stall = body.get("stall_s")
        try:
            engine.set_scenario(
                speed_factor=body.get("speed_factor"),
                kv_fraction=body.get("kv_fraction"),
                max_num_seqs=body.get("max_num_seqs"),
                error_rate=body.get("error_rate"),
                error_status=body.get("error_status"),
                stalled_until=None if stall is None else r.vnow() + float(stall) * r.time_scale,
            )
        except (TypeError, ValueError) as exc:
            raise BadRequest(str(exc)) from None
        r.scenario_changed()
        return JSONResponse(view())
