"""VRAM and KV-cache capacity planner: how many sequences of a given context fit on a GPU.

Public API (pure: dataclasses in, dataclasses out), for the CLI and for the controller, which may use
``CapacityPlan.max_sequences`` as a hard concurrency cap when no backend metric reports KV capacity::

    shape = shape_from_gguf("model.gguf")             # or shape_from_hf_config(...), or ModelShape(...)
    plan = plan_capacity(shape, gpu_gb=24, util=0.9, overhead_gb=1.5)
    plan.fits, plan.kv_capacity_tokens, plan.max_sequences(8192)
"""

from gateway.plan.arith import DEFAULT_OVERHEAD_GB, DEFAULT_UTILIZATION, CapacityPlan, plan_capacity
from gateway.plan.decode import DecodeBound, decode_bound
from gateway.plan.gguf_source import shape_from_gguf
from gateway.plan.hf_source import estimate_params, shape_from_hf_config
from gateway.plan.shape import ModelShape

__all__ = [
    "DEFAULT_OVERHEAD_GB",
    "DEFAULT_UTILIZATION",
    "CapacityPlan",
    "DecodeBound",
    "ModelShape",
    "decode_bound",
    "estimate_params",
    "plan_capacity",
    "shape_from_gguf",
    "shape_from_hf_config",
]
