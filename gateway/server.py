"""Run the gateway from settings: build the app, serve it, announce the URL."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gateway.settings import load_settings


def run(config: Path | None = None, **flags: Any) -> None:
    from gateway.app import create_server_app
    from gateway.serving import serve_app

    settings = load_settings(config, **flags)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_server_app(settings)
    serve_app(
        app, name="sweetspot gateway", host=settings.host, port=settings.port, log_level=settings.log_level,
        banner=lambda: f"upstreams: {', '.join(settings.upstreams)}",
    )
