"""Model presets: configs built offline (random weights, fixed seed)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from transformers import Qwen3MoeConfig

#: ``tiny-qwen3-moe``: a few MB; tests and laptops. 2 layers, 8 experts top-2. The widths live in
#: ``configs/tiny-qwen3-moe.json`` (read without torch by ``npu_lora.train.preflight``).
TINY_QWEN3_MOE: dict[str, Any] = json.loads(
    resources.files("npu_lora").joinpath("models/configs/tiny-qwen3-moe.json").read_text()
)


def preset_config(
    name: str, *, layers: int | None = None, vocab_size: int | None = None
) -> Qwen3MoeConfig:
    """Config of a preset; ``layers`` overrides depth; the vocab grows to ``vocab_size``."""
    if name == "tiny-qwen3-moe":
        cfg = Qwen3MoeConfig(**TINY_QWEN3_MOE)
    elif name == "qwen3-30b-a3b":
        src = resources.files("npu_lora.models").joinpath("configs/qwen3-30b-a3b.json")
        with resources.as_file(src) as p:
            cfg = Qwen3MoeConfig.from_json_file(str(p))
        cfg.output_router_logits = False
    else:
        raise ValueError(f"unknown model preset {name!r}")
    if layers is not None:
        cfg.num_hidden_layers = layers
        if hasattr(cfg, "max_window_layers"):
            cfg.max_window_layers = min(cfg.max_window_layers, layers)
    if vocab_size is not None and vocab_size > cfg.vocab_size:
        cfg.vocab_size = vocab_size
    return cfg
