"""The RNGD compile check's catalogue: the engine's device graphs with example inputs.

``device_graphs`` builds every device module of :mod:`npu_lora.device.graphs` at ``tiny`` or
real Qwen3-30B-A3B widths (one layer, random weights, fixed seed), with example inputs built
exactly as the engine builds them and the stock transformers computation as the reference. It is
the default ``--source`` of ``npu-lora rngd-check`` and the subject of the device-graph tests.
The builders are :mod:`npu_lora.device.examples` (shared with the compile plan's graph list,
:func:`npu_lora.compile.graphs.plan_graphs`).
"""

from __future__ import annotations

from typing import Any

import torch

from npu_lora.device.examples import (
    DeviceGraph,
    GraphBuild,
    attention_graph,
    embed_graph,
    head_graph,
    hot_graphs,
    hot_reference,
)

__all__ = ["DeviceGraph", "device_graphs", "hot_reference"]


def _graph_config(widths: str) -> Any:
    from npu_lora.models.presets import preset_config

    if widths == "tiny":
        cfg = preset_config("tiny-qwen3-moe")
    elif widths == "qwen3-30b-a3b":
        cfg = preset_config("qwen3-30b-a3b", layers=1)
    else:
        raise ValueError(f"widths must be 'tiny' or 'qwen3-30b-a3b', not {widths!r}")
    cfg._attn_implementation = "eager"
    return cfg


def device_graphs(
    widths: str = "tiny",
    seq_len: int = 128,
    buckets: tuple[int, ...] | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    batch: int = 1,
    hot_fraction: float = 0.25,
    lora_r: int = 16,
    seed: int = 0,
) -> list[DeviceGraph]:
    """The engine's device graphs at ``tiny`` or real Qwen3-30B-A3B widths (one layer), random
    weights (fixed seed), with example inputs built exactly as the engine builds them.

    Returns ``embed``, ``attention`` (LoRA r=``lora_r`` on q_proj, v_proj via peft), ``head``
    (label bucket N = S/4) and one ``hot_experts_b<Bk>`` per bucket (default: ``(seq_len,)``).
    ``reference(*example_inputs)`` is the stock transformers computation (int64 ids/positions,
    transformers' rotary embedding, full-sequence logits + ``F.cross_entropy``).
    Note: at Qwen3 widths the embed and head hold 151,936 × 2048 weights each (1.2 GB in fp32).
    """
    b = GraphBuild(_graph_config(widths), torch.manual_seed(seed), batch, seq_len, dtype)
    embed = embed_graph(b)
    attention = attention_graph(b, lora_r)
    h, moe = attention.example_inputs[:2]
    head = head_graph(b, h, moe)
    return [embed, attention, head, *hot_graphs(b, buckets or (seq_len,), hot_fraction)]
