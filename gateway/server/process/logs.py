"""The gateway's logs: one JSON object per line, through the standard ``logging`` machinery.

Log collectors (Loki, CloudWatch, Elasticsearch, ``kubectl logs | jq``) parse JSON lines without a
pattern per message, and every field stays a field: the access log's timings and tokens, the
controller's limit changes. ``python-json-logger`` does the encoding, so a message with odd characters
or a traceback can never break a line. ``log_format = "text"`` is for a person reading a terminal.

Loggers: ``sweetspot.access`` (one line per answered request), ``sweetspot.controller`` (one line per
limit change), ``sweetspot.*`` for the rest.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

from pythonjsonlogger.json import JsonFormatter

access = logging.getLogger("sweetspot.access")

LogFormat = Literal["json", "text"]


def configure_logging(level: str, fmt: LogFormat = "json", *, access_log: bool = True) -> None:
    """Send every record at ``level`` or above to stderr, one line each, replacing earlier handlers;
    ``access_log=False`` silences the access log alone."""
    access.setLevel(logging.NOTSET if access_log else logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(
            JsonFormatter(
                "%(levelname)s %(name)s %(message)s",
                rename_fields={"levelname": "level", "name": "logger"},
                timestamp=True,
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_without_terminal_colours)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def _without_terminal_colours(record: logging.LogRecord) -> bool:
    """uvicorn's records carry a copy of their message with ANSI colours (``color_message``) for its own
    terminal handler; in a JSON line it is noise."""
    record.__dict__.pop("color_message", None)
    return True


def log_access(fields: dict[str, Any]) -> None:
    """One access-log line. Callers build ``fields`` only when :func:`access_enabled` says it is wanted."""
    access.info("access", extra=fields)


def access_enabled() -> bool:
    return access.isEnabledFor(logging.INFO)
