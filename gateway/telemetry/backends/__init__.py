"""Adapters that read an inference server's own signals (vLLM, llama-server) for the controller.

``parse`` turns texts into numbers (pure), ``scraper`` fetches them over HTTP, ``snapshot`` is the value
both produce. See each module for the rules.
"""

from gateway.telemetry.backends.parse import (
    MetricsParseError,
    detect_kind,
    llama_snapshot,
    parse_samples,
    vllm_lora_state,
    vllm_snapshot,
)
from gateway.telemetry.backends.scraper import BackendScraper
from gateway.telemetry.backends.snapshot import BackendKind, BackendSnapshot, LoraState

__all__ = [
    "BackendKind",
    "BackendScraper",
    "BackendSnapshot",
    "LoraState",
    "MetricsParseError",
    "detect_kind",
    "llama_snapshot",
    "parse_samples",
    "vllm_lora_state",
    "vllm_snapshot",
]
