"""Model presets: configs built offline (random weights, fixed seed)."""

from __future__ import annotations

from importlib import resources
from typing import Any

from transformers import Qwen3MoeConfig

TINY_VOCAB = 512

#: ``tiny-qwen3-moe``: a few MB; tests and laptops. 2 layers, 8 experts top-2.
TINY_QWEN3_MOE: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    vocab_size=TINY_VOCAB,
    max_position_embeddings=4096,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    output_router_logits=False,
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
