"""VRAM and KV-cache capacity planner: how many sequences of a given context fit on a GPU.

Public API (pure: dataclasses in, dataclasses out), for the CLI and for the controller, which may use
``CapacityPlan.max_sequences`` as a hard concurrency cap when no backend metric reports KV capacity::

    shape = shape_from_gguf("model.gguf")             # or shape_from_hf_config(...), or ModelShape(...)
    plan = plan_capacity(shape, gpu_gb=24, util=0.9, overhead_gb=1.5)
    plan.fits, plan.kv_capacity_tokens, plan.max_sequences(8192)
    view = vllm_kv_view(layer_specs(shape), plan.kv_memory_bytes, max_model_len=8192)  # what vLLM logs
"""

from gateway.plan.arith import DEFAULT_OVERHEAD_GB, DEFAULT_UTILIZATION, CapacityPlan, plan_capacity, plan_fixed_kv
from gateway.plan.config_reader import ConfigError
from gateway.plan.decode import DecodeBound, decode_bound
from gateway.plan.gguf_source import shape_from_gguf
from gateway.plan.hf_source import estimate_params, shape_from_hf_config
from gateway.plan.shape import ModelShape
from gateway.plan.vllm_view import LayerSpec, VllmKVView, layer_specs, vllm_kv_view

__all__ = [
    "DEFAULT_OVERHEAD_GB",
    "DEFAULT_UTILIZATION",
    "CapacityPlan",
    "ConfigError",
    "DecodeBound",
    "LayerSpec",
    "ModelShape",
    "VllmKVView",
    "decode_bound",
    "estimate_params",
    "layer_specs",
    "plan_capacity",
    "plan_fixed_kv",
    "shape_from_gguf",
    "shape_from_hf_config",
    "vllm_kv_view",
]
