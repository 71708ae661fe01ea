"""Compile-friendly formulations of ops RNGD's compiler rejects (furiosa-torch 2026.4).

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
``torch.softmax``'s gradient to rounding (tested in tests/rngd). In graphs.py's attention
block it removes the ``_softmax_backward_data`` failure, but the whole backward graph then fails
further on, in the compiler (an elementwise kernel of the q_norm/k_norm backward with a
transposed write fails verification; experiments/2026-11-30-rngd-compile-tiny.md).

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

RNGD_ATTENTION = "rngd_eager"

__all__ = [
    "RNGD_ATTENTION",
    "cross_entropy_int32",
    "logsumexp_rngd",
    "register_rngd_attention",
    "rngd_eager_attention_forward",
    "softmax_rngd",
]


class _SoftmaxExplicitBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, dtype: torch.dtype | None) -> torch.Tensor:
        y = torch.softmax(x if dtype is None else x.to(dtype), dim=dim)
        ctx.dim = dim
        ctx.in_dtype = x.dtype
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (y,) = ctx.saved_tensors
        g = g.to(y.dtype)
        gy = (g * y).movedim(ctx.dim, -1)
        # The row sum as a matmul with a ones column: RNGD's compiler fails to verify the fused
        # mul + reduce kernel of sum(g * y, dim) on [.., S, S] (fp32 and bf16, measured), and
        # compiles this form.
        ones = torch.ones(gy.shape[-1], 1, dtype=gy.dtype, device=gy.device)
        s = torch.matmul(gy, ones).movedim(-1, ctx.dim)
        dx = y * (g - s)
        return dx.to(ctx.in_dtype), None, None


def softmax_rngd(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.softmax(x, dim, dtype=dtype)`` whose backward avoids ``_softmax_backward_data``."""
    return _SoftmaxExplicitBackward.apply(x, dim, dtype)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    b, kv, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


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


def logsumexp_rngd(z: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """``torch.logsumexp(z, dim, keepdim)`` as amax/sub/exp/sum/log/add (no ``aten.logsumexp``).

    The max shift is detached: ``d/dz [m + log sum exp(z - m)]`` does not depend on ``m``, so
    the gradient is exactly ``softmax(z)`` either way, and no ``amax`` backward is traced."""
    m = z.detach().amax(dim=dim, keepdim=True)
    out = m + torch.log(torch.exp(z - m).sum(dim=dim, keepdim=True))
    return out if keepdim else out.squeeze(dim)


def cross_entropy_int32(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-row cross-entropy ``logsumexp(z) - z[label]`` with int32 ``labels`` picked by an int32
    compare against ``arange(V, dtype=int32)`` (no gather, no int64). ``weights`` (same shape as
    ``labels``) gives ``sum(w * ce)``; without it the per-row losses are returned."""
    z = logits.float()
    vocab = torch.arange(z.shape[-1], dtype=torch.int32, device=z.device)
    onehot = (vocab == labels[..., None]).to(z.dtype)
    ce = logsumexp_rngd(z, dim=-1) - (z * onehot).sum(-1)
    return ce if weights is None else (ce * weights.float()).sum()
