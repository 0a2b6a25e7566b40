"""Parameter counts from a config's dimensions, split by class so quantisation can size each class.

A config has no weights, so the counts follow each family's layout: embeddings and LM head (one matrix
when tied); attention (q, k, v, o; Qwen3-Next's gated q is twice as wide; MLA's low-rank q and kv
projections); linear-attention projections (gated DeltaNet); SwiGLU/GeGLU MLPs (3 matrices) in dense
layers; and in MoE layers the routed experts, the shared experts and the router. Norms, biases and
attention sinks are ignored (well under 0.1 %). Pass --params for anything exotic.

Which layers are MoE: every layer for Mixtral and gpt-oss; Qwen-MoE skips ``mlp_only_layers`` and
honours ``decoder_sparse_step``; DeepSeek keeps its first ``first_k_dense_replace`` layers dense and
then every ``moe_layer_freq``-th layer is MoE. Shared experts: DeepSeek's ``n_shared_experts`` experts
of ``moe_intermediate_size``; Qwen's one shared expert of ``shared_expert_intermediate_size``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.plan.config_reader import ConfigReader
from gateway.plan.layout import Layout

# Families whose config class defaults tie_word_embeddings to True when the key is absent.
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")
# Families whose config class defaults it to False (Transformers' own default is True).
UNTIED_BY_DEFAULT = (
    "llama",
    "llama4",
    "llama4_text",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "deepseek_v2",
    "deepseek_v3",
    "kimi_k2",
    "gpt_oss",
)


@dataclass(frozen=True)
class ParamCounts:
    """Parameters per class; ``routed`` is every routed expert of every MoE layer."""

    embed: float
    lm_head: float
    attention: float
    linear_attention: float
    dense_mlp: float
    shared_experts: float
    routed: float
    router: float
    active_routed: float  # routed parameters one token uses (experts_per_tok of each MoE layer)

    @property
    def total(self) -> float:
        return (
            self.embed
            + self.lm_head
            + self.attention
            + self.linear_attention
            + self.dense_mlp
            + self.shared_experts
            + self.routed
            + self.router
        )

    @property
    def active(self) -> float:
        return self.total - self.routed + self.active_routed


def tied_embeddings(reader: ConfigReader) -> tuple[bool, str | None]:
    """(tied, the assumption made when the config does not say)."""
    value = reader.get("tie_word_embeddings")
    if value is not None:
        return bool(value), None
    model_type = str(reader.get("model_type", ""))
    if model_type in TIED_BY_DEFAULT:
        return True, f"tie_word_embeddings absent: {model_type} ties them by default (one embedding matrix)"
    if model_type in UNTIED_BY_DEFAULT:
        return False, None
    return False, "tie_word_embeddings absent: assumed untied (a separate LM head is counted)"


def _attention(reader: ConfigReader, hidden: int, heads: int, kv_heads: int, head_dim: int) -> float:
    if reader.has("kv_lora_rank"):  # MLA (DeepSeek-V2/V3, Kimi-K2)
        rank = reader.require_int("kv_lora_rank")
        rope = reader.require_int("qk_rope_head_dim")
        nope = reader.require_int("qk_nope_head_dim")
        v_dim = reader.require_int("v_head_dim")
        q_rank = reader.opt_int("q_lora_rank")
        q_head = nope + rope
        q = hidden * q_rank + q_rank * heads * q_head if q_rank else hidden * heads * q_head
        kv_a = hidden * (rank + rope)
        kv_b = rank * heads * (nope + v_dim)
        return float(q + kv_a + kv_b + heads * v_dim * hidden)
    model_type = str(reader.get("model_type", ""))
    gated_q = 2 if (reader.get("attn_output_gate") or model_type.startswith("qwen3_next")) else 1
    return float(hidden * heads * head_dim * gated_q + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden)


def _linear_attention(reader: ConfigReader, hidden: int) -> float:
    v_heads = reader.opt_int("linear_num_value_heads")
    if not v_heads:
        return 0.0
    k_heads = reader.opt_int("linear_num_key_heads", v_heads) or v_heads
    k_dim = reader.opt_int("linear_key_head_dim", 128) or 128
    v_dim = reader.opt_int("linear_value_head_dim", k_dim) or k_dim
    key_total, value_total = k_heads * k_dim, v_heads * v_dim
    kernel = reader.opt_int("linear_conv_kernel_dim", 4) or 4
    return float(
        hidden * (2 * key_total + 2 * value_total)  # q, k, v and the output gate z
        + hidden * 2 * v_heads  # per-head beta and decay
        + (2 * key_total + value_total) * kernel  # depthwise convolution
        + value_total * hidden  # output projection
    )


def _moe_layers(reader: ConfigReader, layers: int) -> list[int]:
    if reader.has("first_k_dense_replace") or reader.has("n_routed_experts"):
        first = reader.opt_int("first_k_dense_replace", 0, minimum=0) or 0
        freq = reader.opt_int("moe_layer_freq", 1) or 1
        return [i for i in range(layers) if i >= first and i % freq == 0]
    step = reader.opt_int("decoder_sparse_step", 1) or 1
    only_dense = set(reader.get("mlp_only_layers") or [])
    return [i for i in range(layers) if i not in only_dense and (i + 1) % step == 0]


def experts_of(reader: ConfigReader) -> tuple[int, int]:
    """(routed experts per MoE layer, experts each token uses); (0, 0) for a dense model."""
    experts = (
        reader.opt_int("num_experts") or reader.opt_int("num_local_experts") or reader.opt_int("n_routed_experts") or 0
    )
    used = reader.opt_int("num_experts_per_tok") or reader.opt_int("experts_per_token") or 0
    if experts and not used:
        raise reader.error("num_experts_per_tok", "is missing for a MoE config")
    if used > experts:
        raise reader.error("num_experts_per_tok", f"({used}) exceeds the number of experts ({experts})")
    return experts, used


def count_params(reader: ConfigReader, layout: Layout, heads: int, kv_heads: int, head_dim: int) -> ParamCounts:
    """Parameter classes of the ``len(layout.kinds)`` served decoder layers."""
    hidden = reader.require_int("hidden_size")
    layers = len(layout.kinds)
    vocab = reader.opt_int("vocab_size", 0, minimum=0) or 0
    tied, _ = tied_embeddings(reader)

    experts, used = experts_of(reader)
    moe = _moe_layers(reader, layers) if experts else []
    dense_layers = layers - len(moe)
    intermediate = reader.opt_int("intermediate_size", 0, minimum=0) or 0
    if dense_layers and not intermediate:
        raise reader.error("intermediate_size", "is missing, and the model has dense MLP layers")
    expert_inter = reader.opt_int("moe_intermediate_size") or intermediate
    expert = 3 * hidden * expert_inter
    shared = 3 * hidden * (reader.opt_int("n_shared_experts", 0, minimum=0) or 0) * expert_inter
    shared += 3 * hidden * (reader.opt_int("shared_expert_intermediate_size", 0, minimum=0) or 0)

    return ParamCounts(
        embed=float(vocab * hidden),
        lm_head=0.0 if tied else float(vocab * hidden),
        attention=layout.kv_layers * _attention(reader, hidden, heads, kv_heads, head_dim),
        linear_attention=layout.count("state") * _linear_attention(reader, hidden),
        dense_mlp=float(dense_layers * 3 * hidden * intermediate),
        shared_experts=float(len(moe) * shared),
        routed=float(len(moe) * experts * expert),
        router=float(len(moe) * hidden * experts),
        active_routed=float(len(moe) * used * expert),
    )
