"""A bench's figures written as strict JSON.

Python's ``json`` writes a ratio against a configuration that delivered nothing as ``Infinity`` and a figure
with no samples as ``NaN``. Python reads both back; ``jq``, JavaScript and most other parsers refuse the file.
A figure with no finite value is written as ``null`` instead: the docs that cite it say what it means.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every non-finite float in it (at any depth) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(payload: Any, *, indent: int | None = 1, default: Any = None) -> str:
    """``payload`` as strict JSON text (no NaN or Infinity), for files and for printed lines alike."""
    return json.dumps(finite(payload), indent=indent, allow_nan=False, default=default)


def write_json(path: Path, payload: Any, *, indent: int = 1, default: Any = None) -> None:
    """Write ``payload`` to ``path`` as strict JSON with a final newline, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(payload, indent=indent, default=default) + "\n", encoding="utf-8")


def strict_loads(text: str) -> Any:
    """JSON as ``jq`` or a browser reads it: Python's ``NaN`` and ``Infinity`` are refused, so a check that
    reads a bench's output with this fails where another tool reading the file would."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)
