"""Checked access to a Hugging Face ``config.json``: every refusal names the file and the field.

A config with a missing, null, zero or negative size, or heads that do not divide, must stop the plan
with one line the user can act on ("config.json: num_attention_heads must be a positive integer, got
0"), never a traceback and never a negative capacity presented as an answer. Multimodal checkpoints
keep the language model under ``text_config``; its keys win and are named ``text_config.<key>``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config value the planner cannot use; the message is one line naming file and field."""


class ConfigReader:
    """Typed, validated reads from a (text) config."""

    def __init__(self, raw: Mapping[str, Any], origin: str) -> None:
        self.origin = origin
        self.raw = raw
        text = raw.get("text_config")
        self._text_keys: set[str] = set()
        merged = dict(raw)
        if isinstance(text, Mapping):
            merged.update(text)
            self._text_keys = set(text)
        self.cfg: dict[str, Any] = merged

    @classmethod
    def from_file(cls, path: Path) -> ConfigReader:
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not a text file") from None
        if not isinstance(raw, dict):
            raise ConfigError(
                f"{path}: expected a JSON object, got a {type(raw).__name__ if raw is not None else 'null'}"
            )
        return cls(raw, str(path))

    # -- naming --------------------------------------------------------------------------------------
    def name(self, key: str) -> str:
        return f"text_config.{key}" if key in self._text_keys else key

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.origin}: {self.name(key)} {problem}")

    # -- reads ---------------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key)
        return default if value is None else value

    def _int(self, key: str, value: Any, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"must be an integer, got {json.dumps(value)}")
        if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
            raise self.error(key, f"must be an integer, got {value}")
        number = int(value)
        if number < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.error(key, f"must be {kind}, got {number}")
        return number

    def require_int(self, key: str, minimum: int = 1, maximum: int | None = None) -> int:
        """A size the model cannot be planned without."""
        if key not in self.cfg:
            raise self.error(key, "is missing: is this a decoder LLM config?")
        if self.cfg[key] is None:
            raise self.error(key, "is null")
        value = self._int(key, self.cfg[key], minimum)
        if maximum is not None and value > maximum:
            raise self.error(key, f"must be at most {maximum:,}, got {value:,}")
        return value

    def opt_int(self, key: str, default: int | None = None, minimum: int = 1) -> int | None:
        """An optional size: absent or null gives ``default``; present must be valid."""
        value = self.cfg.get(key)
        if value is None:
            return default
        return self._int(key, value, minimum)

    def int_list(self, key: str, length: int, minimum: int = 0) -> list[int] | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) < length:
            raise self.error(key, f"must be a list of at least {length} integers")
        return [self._int(key, v, minimum) for v in value[:length]]

    def str_list(self, key: str, length: int) -> list[str] | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, "must be a list of strings")
        if len(value) < length:
            raise self.error(key, f"lists {len(value)} layers, fewer than num_hidden_layers ({length})")
        return list(value[:length])

    def mapping(self, key: str) -> Mapping[str, Any] | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.error(key, "must be an object")
        return value
