"""Run the simulator under uvicorn (uvloop + httptools) and announce where it listens.

The socket is bound here, before uvicorn starts, so ``port=0`` works: the kernel picks a free
port and the announcement line carries it. Tests and the demo start ``sweetspot sim --port 0``
as a subprocess and read the URL from that line.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn

from gateway.sim.server import SimConfig, create_app

READY_PREFIX = "sweetspot sim listening on "


def serve(config: SimConfig, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> None:
    """Serve until SIGINT/SIGTERM. Prints ``sweetspot sim listening on http://HOST:PORT`` once ready."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    bound_port = sock.getsockname()[1]
    shown_host = f"[{host}]" if family == socket.AF_INET6 else host
    uv_config = uvicorn.Config(create_app(config), http="httptools", loop="uvloop", lifespan="on",
                               log_level=log_level, access_log=False, timeout_keep_alive=30)
    server = uvicorn.Server(uv_config)

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            p = config.profile
            print(f"profile {p.name}: {p.model} on {p.gpu_name}, {p.num_gpu_blocks} KV blocks of "
                  f"{p.block_size} tokens, max_num_seqs {p.max_num_seqs}, time scale {config.time_scale}",
                  flush=True)
            print(f"{READY_PREFIX}http://{shown_host}:{bound_port}", flush=True)
        await task

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        asyncio.run(main())
    sys.stdout.flush()
