"""Run the simulator under uvicorn and announce where it listens.

``port=0`` works: the socket is bound first and the line ``sweetspot sim listening on
http://HOST:PORT`` carries the port the kernel picked. Tests and the demo start
``sweetspot sim --port 0`` as a subprocess and read the URL from that line.
"""

from __future__ import annotations

from gateway.serving import serve_app
from gateway.sim.server import SimConfig, create_app



def serve(config: SimConfig, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> None:
    """Serve until SIGINT/SIGTERM. Prints ``sweetspot sim listening on http://HOST:PORT`` once ready."""
    p = config.profile

    def banner() -> str:
        return (f"profile {p.name}: {p.model} on {p.gpu_name}, {p.num_gpu_blocks} KV blocks of "
                f"{p.block_size} tokens, max_num_seqs {p.max_num_seqs}, time scale {config.time_scale}")

    serve_app(create_app(config), name="sweetspot sim", host=host, port=port, log_level=log_level, banner=banner)
