"""Tiny Hugging Face PEFT LoRA adapters for tiny_checkpoint's Llama, laid out as PEFT's save_pretrained writes them
(adapter_config.json + adapter_model.safetensors, tensors named base_model.model.model.layers.<i>.<block>.<module>
.lora_{A,B}.weight), shared by the test suites."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from harness.tiny_checkpoint import write_safetensors

# tiny_llama's sizes: hidden 16, intermediate 32, 2 heads of 8 (also key/value), 1 layer.
TINY_SIZES = {
    "q_proj": ("self_attn", 16, 16),
    "k_proj": ("self_attn", 16, 16),
    "v_proj": ("self_attn", 16, 16),
    "o_proj": ("self_attn", 16, 16),
    "gate_proj": ("mlp", 16, 32),
    "up_proj": ("mlp", 16, 32),
    "down_proj": ("mlp", 32, 16),
}


def tiny_lora(
    dest: Path,
    *,
    rank: int = 4,
    modules: Sequence[str] = ("q_proj", "v_proj"),
    layers: int = 1,
    base_model: str | None = None,
    scale: int = 1,
    alpha: float = 8,
    fill: int = 0,
) -> Path:
    """One adapter in `dest` (created). `scale` multiplies the base sizes: 2 makes an adapter for a wider model;
    `fill` sets every weight byte, so adapters of equal shape can differ in content."""
    dest.mkdir(parents=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.05,
        "target_modules": list(modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
    tensors = {}
    for layer in range(layers):
        for module in modules:
            block, inputs, outputs = TINY_SIZES[module]
            inputs, outputs = inputs * scale, outputs * scale
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = ([rank, inputs], bytes([fill]) * (2 * rank * inputs))
            tensors[f"{prefix}.lora_B.weight"] = ([outputs, rank], bytes([fill]) * (2 * outputs * rank))
    write_safetensors(dest / "adapter_model.safetensors", tensors)
    return dest
