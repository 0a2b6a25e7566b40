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


#: The handler :func:`configure_logging` installed for JSON lines: the access log writes to its stream itself.
_json_handler: logging.StreamHandler[Any] | None = None


def configure_logging(level: str, fmt: LogFormat = "json", *, access_log: bool = True) -> None:
    """Send every record at ``level`` or above to stderr, one line each, replacing earlier handlers;
    ``access_log=False`` silences the access log alone."""
    global _json_handler
    access.setLevel(logging.NOTSET if access_log else logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    _json_handler = handler if fmt == "json" else None
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
        line = _head(datetime.fromtimestamp(record.created, tz=UTC), record.levelname, record.name, record.getMessage())
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES:
                line[key] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return self._encoder.encode(line).decode()


def _head(created: datetime, level: str, logger: str, message: str) -> dict[str, Any]:
    """The fields every line starts with, in their order: one place, so the access log's own lines and
    :class:`JsonLines`' cannot drift apart."""
    return {"timestamp": created.isoformat(), "level": level, "logger": logger, "message": message}


def _without_terminal_colours(record: logging.LogRecord) -> bool:
    """uvicorn's records carry a copy of their message with ANSI colours (``color_message``) for its own
    terminal handler; in a JSON line it is noise."""
    record.__dict__.pop("color_message", None)
    return True


def log_access(fields: dict[str, Any]) -> None:
    """One access-log line. Callers build ``fields`` only when :func:`access_enabled` says it is wanted.

    With the gateway's own JSON logging in place (the root's one handler, none on the access logger), the line
    is encoded and written to that handler's stream here, under its lock: the same line :class:`JsonLines`
    makes of a record, without the record. A line per request is the hot path's, and a ``LogRecord`` with the
    fields as its attributes, checked one by one, cost more than the line itself (docs/performance.md).
    Any other logging configuration gets the record, through ``logging``."""
    if not access.isEnabledFor(logging.INFO):  # (cached by logging: a dict lookup)
        return
    handler = _json_handler
    root_handlers = logging.root.handlers
    if handler is None or access.handlers or len(root_handlers) != 1 or root_handlers[0] is not handler:
        access.info("access", extra=fields)
        return
    line = _head(datetime.now(UTC), "INFO", access.name, "access")
    line.update(fields)
    text = JsonLines._encoder.encode(line).decode() + handler.terminator
    handler.acquire()
    try:
        handler.stream.write(text)
        handler.flush()
    except (OSError, ValueError):  # a closed or broken stream: as logging reports it, not raised here
        handler.handleError(logging.makeLogRecord({"msg": "access", "name": access.name}))
    finally:
        handler.release()


def access_enabled() -> bool:
    return access.isEnabledFor(logging.INFO)
