"""Models: presets, local HF directories, LoRA injection (peft)."""

from npu_lora.models.build import (
    EXPERT_PARAM_NAMES,
    build_model,
    causal_lm,
    decoder_layers,
    inject_lora,
    load_base_model,
    moe_blocks,
    to_dtype,
)
from npu_lora.models.presets import TINY_QWEN3_MOE, preset_config

__all__ = [
    "EXPERT_PARAM_NAMES",
    "TINY_QWEN3_MOE",
    "build_model",
    "causal_lm",
    "decoder_layers",
    "inject_lora",
    "load_base_model",
    "moe_blocks",
    "preset_config",
    "to_dtype",
]
