"""Which kind of cache each layer of a Hugging Face config keeps: full, sliding, chunked or a state.

``layer_types`` (Transformers' per-layer list) is used when present. Older configs give only a window,
and the layout is then the family's own, as vLLM and Transformers build it:

* Gemma-2: even layers (0, 2, ...) slide, odd ones are global;
* Gemma-3: every ``sliding_window_pattern``-th layer (default 6) is global, the rest slide;
* Llama-4: layers with RoPE use chunked local attention of ``attention_chunk_size``; every
  ``no_rope_layer_interval``-th layer (default 4, or the ``no_rope_layers`` list) is global;
* any other config with a ``sliding_window`` (and no ``use_sliding_window: false``, which Qwen2/Qwen3
  configs carry) slides in every layer, as vLLM applies a model-wide window (Mistral-7B-v0.1);
* hybrids without ``layer_types``: ``full_attention_interval`` marks the attention layers, the rest
  are linear attention (Qwen3-Next).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.plan.config_reader import ConfigReader

FULL_TYPES = {"full_attention", "attention", "global_attention", "global"}
SLIDING_TYPES = {"sliding_attention", "sliding_window_attention", "local_attention", "local"}
CHUNKED_TYPES = {"chunked_attention"}
STATE_TYPES = {"linear_attention", "mamba", "mamba2", "gated_deltanet", "recurrent", "conv", "short_conv"}


@dataclass(frozen=True)
class Layout:
    """Per-layer cache kinds ("full", "sliding", "chunked", "state") and their windows."""

    kinds: tuple[str, ...]
    sliding_window: int | None = None
    attention_chunk: int | None = None
    source: str = "config.num_hidden_layers"
    assumptions: tuple[str, ...] = field(default=())

    def count(self, kind: str) -> int:
        return sum(1 for k in self.kinds if k == kind)

    @property
    def kv_layers(self) -> int:
        return len(self.kinds) - self.count("state")


def _window(reader: ConfigReader, key: str, why: str) -> int:
    if not reader.has(key):
        raise reader.error(key, f"is missing, but {why}")
    value = reader.require_int(key)
    return value


def read_layout(reader: ConfigReader, layers: int) -> Layout:
    """The layout of ``layers`` decoder layers (MTP / next-token heads beyond them are not served)."""
    model_type = str(reader.get("model_type", ""))
    types = reader.str_list("layer_types", layers)
    if types is not None:
        kinds = []
        for t in types:
            if t in FULL_TYPES:
                kinds.append("full")
            elif t in SLIDING_TYPES:
                kinds.append("sliding")
            elif t in CHUNKED_TYPES:
                kinds.append("chunked")
            elif t in STATE_TYPES:
                kinds.append("state")
            else:
                raise reader.error("layer_types", f"has a layer kind the planner does not know: {t!r}")
        window = _window(reader, "sliding_window", "layer_types has sliding layers") if "sliding" in kinds else None
        chunk = (
            _window(reader, "attention_chunk_size", "layer_types has chunked layers") if "chunked" in kinds else None
        )
        return Layout(tuple(kinds), window, chunk, "config.layer_types")

    interval = reader.opt_int("full_attention_interval")
    if interval:
        kinds = ["full" if (i + 1) % interval == 0 else "state" for i in range(layers)]
        return Layout(tuple(kinds), source=f"config.full_attention_interval={interval}")

    if model_type == "gemma2" and reader.has("sliding_window"):
        window = reader.require_int("sliding_window")
        kinds = ["sliding" if i % 2 == 0 else "full" for i in range(layers)]
        return Layout(
            tuple(kinds),
            window,
            source="Gemma-2 layout: even layers slide (config.sliding_window)",
            assumptions=("no layer_types: Gemma-2's layout, even layers sliding, odd layers global",),
        )

    if model_type in ("gemma3", "gemma3_text") and reader.has("sliding_window"):
        window = reader.require_int("sliding_window")
        pattern = reader.opt_int("sliding_window_pattern", 6)
        assert pattern is not None
        kinds = ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(layers)]
        return Layout(
            tuple(kinds),
            window,
            source=f"Gemma-3 layout: 1 global in {pattern} (config.sliding_window)",
            assumptions=(f"no layer_types: Gemma-3's layout, every {pattern}th layer global, the rest sliding",),
        )

    if model_type.startswith("llama4") and reader.has("attention_chunk_size"):
        chunk = reader.require_int("attention_chunk_size")
        rope = reader.int_list("no_rope_layers", layers)
        if rope is None:
            step = reader.opt_int("no_rope_layer_interval", 4)
            assert step is not None
            rope = [int((i + 1) % step != 0) for i in range(layers)]
        kinds = ["chunked" if r else "full" for r in rope]
        return Layout(
            tuple(kinds),
            attention_chunk=chunk,
            source="Llama-4 layout: RoPE layers chunked, NoPE layers global",
            assumptions=("Llama-4: layers with RoPE use chunked local attention, NoPE layers global",),
        )

    if reader.has("sliding_window") and reader.get("use_sliding_window", True) is not False:
        window = reader.require_int("sliding_window")
        return Layout(
            ("sliding",) * layers,
            window,
            source="config.sliding_window (every layer)",
            assumptions=("a model-wide sliding_window and no layer_types: every layer slides, as vLLM runs it",),
        )

    return Layout(("full",) * layers)
