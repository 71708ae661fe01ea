"""Compile-friendly formulations of ops RNGD's compiler rejects (furiosa-torch 2026.4).

``softmax_rngd``, ``logsumexp_rngd`` and ``cross_entropy_int32`` live in
``npu_lora.device.ops`` (the device graphs use them on every backend) and are re-exported here;
this module adds the transformers attention-interface registration.

``softmax_rngd``: the attention softmax. transformers' eager attention computes
``softmax(scores, dim=-1, dtype=torch.float32)`` (an fp32 upcast even for bf16 models); its
autograd backward is ``aten._softmax_backward_data`` in float32, which does not compile on RNGD
(bf16 does). ``softmax_rngd`` keeps the forward (``aten._softmax`` in fp32, which compiles) and
gives it an explicit backward::

    dx = y * (g - (g * y) @ ones[S, 1])

which is the math of ``_softmax_backward_data`` with the row sum written as a matmul. Measured
with whole-graph compiles of ``[1, 4, 128, 128]`` inputs: ``_softmax_backward_data`` and the
plain ``y * (g - sum(g * y, -1))`` fail (fp32 and bf16: the fused mul+reduce kernel fails
verification), the matmul row sum compiles (fp32 17 s, bf16 12 s). Numerically it equals
``torch.softmax``'s gradient to rounding (tested in tests/rngd). With the stock module
(this attention interface) the whole backward graph then still fails in the compiler: the
backward of ``v_proj(x).view(...).transpose(1, 2)`` fuses "transpose dV, x LoRA scaling" into an
elementwise kernel that fails verification; graphs.py's ``DeviceAttentionBlock`` computes v per
head instead (experiments/2026-11-30-rngd-compile-tiny.md).

``rngd_eager_attention_forward``: transformers' ``eager_attention_forward`` with that softmax,
registrable as an attention implementation (``register_rngd_attention()`` then
``config._attn_implementation = "rngd_eager"``), so the stock ``Qwen3MoeAttention`` module (and
peft's LoRA on it) stays untouched.

``logsumexp_rngd``: ``torch.logsumexp`` does not compile on RNGD, per op or whole graph
("failed to import dfg: Not importable for all cases, logsumexp", measured on graphs.py's head);
written out as ``m + log(sum(exp(z - m)))`` with ``m = amax(z)`` held constant (its gradient
cancels exactly), forward and backward are elementwise ops plus ``amax``/``sum`` reductions.
graphs.py's head with it compiles whole, forward (78 s cold) and backward (121 s).

``cross_entropy_int32``: cross-entropy with int32 labels via an int32 compare (one-hot) instead
of ``nll_loss``/``gather`` (which need int64 targets on CPU torch and produce int64 index ops),
with ``logsumexp_rngd``.

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
