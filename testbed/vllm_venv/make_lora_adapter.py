"""Write a random-weight LoRA adapter for a model made by ``make_hf_model.py``, in PEFT's layout, with no download.

Run with the vLLM virtualenv's python (it needs torch and safetensors, which the gateway's own environment must
not carry)::

    $VLLM_VENV/bin/python testbed/vllm_venv/make_lora_adapter.py --model MODEL_DIR --out ADAPTER_DIR --rank 8

What it writes is what ``peft``'s ``save_pretrained`` writes for a LoRA on ``q_proj`` and ``v_proj`` (vLLM loads
it with ``/v1/load_lora_adapter`` or ``--lora-modules``): ``adapter_config.json`` and
``adapter_model.safetensors`` with keys ``base_model.model.model.layers.{i}.self_attn.{q,v}_proj.lora_{A,B}.weight``,
``lora_A`` of shape ``[rank, in]`` and ``lora_B`` of shape ``[out, rank]``, the shapes read from the model's own
``config.json``. PEFT starts ``lora_B`` at zero, which would leave the base model's answers unchanged; here both
are random (fixed seed) and large enough that a greedy answer through the adapter differs from the base model's,
so a test can tell which one answered. The directory is written next to ``--out`` and renamed into place.

This file imports nothing from the project but its sibling ``make_hf_model.py``: it runs in another interpreter.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from make_hf_model import staged  # the sibling script: this file runs from its own folder

TARGETS = ("q_proj", "v_proj")


def projection_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target projection of a Llama-style attention block."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    return {"q_proj": (hidden, heads * head_dim), "v_proj": (hidden, kv_heads * head_dim)}


def write_adapter(model: Path, out: Path, *, rank: int, alpha: int, seed: int, std: float) -> None:
    import torch
    from safetensors.torch import save_file

    config = json.loads((model / "config.json").read_text())
    shapes = projection_shapes(config)
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for name in TARGETS:
            fan_in, fan_out = shapes[name]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * std
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model),
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }
    with staged(out) as staging:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(staging / "adapter_model.safetensors"))
        (staging / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the model directory (its config.json)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--std", type=float, default=0.1, help="standard deviation of the random weights")
    a = parser.parse_args()
    write_adapter(a.model, a.out, rank=a.rank, alpha=a.alpha, seed=a.seed, std=a.std)


if __name__ == "__main__":
    main()
