"""Run the gateway app under uvicorn (uvloop + httptools), from settings."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import uvicorn

from gateway.settings import load_settings


def run(config: Path | None = None, **flags: Any) -> None:
    from gateway.app import create_app

    settings = load_settings(config, **flags)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
