"""Compile-friendly formulations of ops RNGD's compiler rejects (furiosa-torch 2026.4).

``softmax_rngd``, ``logsumexp_rngd`` and ``cross_entropy_int32`` live in
``npu_lora.device.ops`` (the device graphs use them on every backend) and are re-exported here;
this module adds the transformers attention-interface registration.

Why each formulation exists, and what was measured, is in ``npu_lora.device.ops``.

``rngd_eager_attention_forward``: transformers' ``eager_attention_forward`` with ``softmax_rngd``,
registrable as an attention implementation (``register_rngd_attention()`` then
``config._attn_implementation = "rngd_eager"``), so the stock ``Qwen3MoeAttention`` module (and
peft's LoRA on it) stays untouched. With the stock module the whole backward graph still fails
in the compiler: the backward of ``v_proj(x).view(...).transpose(1, 2)`` fuses "transpose dV,
x LoRA scaling" into an elementwise kernel that fails verification; graphs.py's
``DeviceAttentionBlock`` computes v per head instead (experiments/2026-11-30-rngd-compile-tiny.md).

Importing this module imports torch but not transformers or furiosa-torch.
"""

from __future__ import annotations

from typing import Any

import torch

from npu_lora.device.ops import (
    cross_entropy_int32,
    logsumexp_rngd,
    softmax_rngd,
)
from npu_lora.device.ops import repeat_kv as _repeat_kv

RNGD_ATTENTION = "rngd_eager"

__all__ = [
    "RNGD_ATTENTION",
    "cross_entropy_int32",
    "logsumexp_rngd",
    "register_rngd_attention",
    "rngd_eager_attention_forward",
    "softmax_rngd",
]


def rngd_eager_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``eager_attention_forward`` (Qwen3-MoE, 5.x), softmax via ``softmax_rngd``.

    Same signature and outputs; dropout is only applied when ``dropout > 0`` and training (the
    stock code calls ``F.dropout`` even with p=0, which is a no-op)."""
    n_rep = getattr(module, "num_key_value_groups", 1)
    key_states = _repeat_kv(key, n_rep)
    value_states = _repeat_kv(value, n_rep)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = softmax_rngd(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout > 0.0 and module.training:
        attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout, training=True)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


def register_rngd_attention(name: str = RNGD_ATTENTION) -> str:
    """Register ``rngd_eager_attention_forward`` with transformers' ``AttentionInterface``;
    then set ``config._attn_implementation = name`` (returned)."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, rngd_eager_attention_forward)
    return name
