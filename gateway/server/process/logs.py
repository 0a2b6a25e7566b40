"""The gateway's logs: one JSON object per line, through the standard ``logging`` machinery.

Log collectors (Loki, CloudWatch, Elasticsearch, ``kubectl logs | jq``) parse JSON lines without a
pattern per message, and every field stays a field: the access log's timings and tokens, the
controller's limit changes. :class:`JsonLines` encodes a record with msgspec (a message with odd characters
or a traceback is escaped, never breaks a line): the access log writes a line per request, so its
formatting is on the hot path, and msgspec does it in a quarter of the time of a formatter built on the
``json`` module (docs/performance.md). ``log_format = "text"`` is for a person reading a terminal.

Loggers: ``sweetspot.access`` (one line per answered request), ``sweetspot.controller`` (one line per
limit change), ``sweetspot.*`` for the rest.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

access = logging.getLogger("sweetspot.access")

LogFormat = Literal["json", "text"]


def configure_logging(level: str, fmt: LogFormat = "json", *, access_log: bool = True) -> None:
    """Send every record at ``level`` or above to stderr, one line each, replacing earlier handlers;
    ``access_log=False`` silences the access log alone."""
    access.setLevel(logging.NOTSET if access_log else logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_without_terminal_colours)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


#: A record's own attributes (``logging.LogRecord``'s); every other attribute came from ``extra`` and is a field.
_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonLines(logging.Formatter):
    """A record as one JSON object: ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, then
    every field given in ``extra``, then ``exc_info`` and ``stack_info`` as text when present. A value JSON
    cannot hold is written as its ``str()``; NaN and infinities as ``null``."""

    _encoder = msgspec.json.Encoder(enc_hook=str)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, tz=UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES:
                line[key] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return self._encoder.encode(line).decode()


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
