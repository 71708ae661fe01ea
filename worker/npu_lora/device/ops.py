"""Compile-friendly formulations of ops RNGD's compiler rejects (furiosa-torch 2026.4).

The device graphs (``npu_lora.device.graphs``) use these on every backend, so the CPU engine
runs exactly the graphs that compile. Measured in experiments/2026-11-30-rngd-compile-tiny.md.

``softmax_rngd``: the attention softmax. transformers' eager attention computes
``softmax(scores, dim=-1, dtype=torch.float32)`` (an fp32 upcast even for bf16 models); its
autograd backward is ``aten._softmax_backward_data`` in float32, which does not compile on RNGD
(bf16 does). ``softmax_rngd`` keeps the forward (``aten._softmax`` in fp32, which compiles) and
gives it an explicit backward::

    dx = y * (g - (g * y) @ ones[S, 1])

which is the math of ``_softmax_backward_data`` with the row sum written as a matmul. Measured
with whole-graph compiles of ``[1, 4, 128, 128]`` inputs: ``_softmax_backward_data`` and the
plain ``y * (g - sum(g * y, -1))`` fail (fp32 and bf16: the fused mul+reduce kernel fails
verification), the matmul row sum compiles (fp32 17 s, bf16 12 s). Its forward is bitwise
``torch.softmax``; its gradient equals ``torch.softmax``'s to rounding.

``eager_attention``: transformers' ``eager_attention_forward`` (GQA repeat, scaled scores plus
an additive mask, fp32 softmax, weights @ values), same forward arithmetic, as an autograd
Function with a FlashAttention-style backward (``_AttentionCore``). ``softmax_rngd`` stays for
``rngd.formulations`` (the stock module with a compile-friendly softmax backward).

``logsumexp_rngd``: ``torch.logsumexp`` does not compile on RNGD, per op or whole graph
("failed to import dfg: Not importable for all cases, logsumexp"); written out as
``m + log(sum(exp(z - m)))`` with ``m = amax(z)`` held constant (its gradient cancels exactly),
forward and backward are elementwise ops plus ``amax``/``sum`` reductions (the head compiles
whole: forward 78 s, backward 121 s cold).

``cross_entropy_int32``: cross-entropy with int32 labels via an int32 compare (one-hot) instead
of ``nll_loss``/``gather`` (which need int64 targets and produce int64 index ops), with
``logsumexp_rngd``.

Pure torch: no transformers, no furiosa-torch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "cross_entropy_int32",
    "eager_attention",
    "head_label_logits",
    "logsumexp_rngd",
    "repeat_kv",
    "sdpa_attention",
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


def repeat_kv(x_BKSd: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[B, K, S, d] -> [B, K * n_rep, S, d]`` (transformers' ``repeat_kv``)."""
    b, kv, s, d = x_BKSd.shape
    if n_rep == 1:
        return x_BKSd
    return x_BKSd[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


class _AttentionCore(torch.autograd.Function):
    """Scores, fp32 softmax, weights @ values, with a FlashAttention-style explicit backward.

    Forward (transformers' eager arithmetic; K/V repeated for GQA)::

        S = q k^T * scaling + mask     P = softmax(S, fp32).to(q.dtype)     O = P v

    Backward (dO in; saved q, K, V (repeated), P, O: the same tensors autograd would keep)::

        dV = P^T dO     dP = dO V^T     D = (dO * O) @ ones[d, 1]     dS = P * (dP - D)  (fp32)
        dq = dS K * scaling     dK = dS^T q * scaling     (dK, dV summed over each KV head's group)

    ``D = rowsum(dO * O)`` equals the softmax backward's ``rowsum(dP * P)`` (since O = P V) and
    is a row sum over the head dim, written as a matmul with ones. RNGD: at Qwen3 widths (8 query
    heads per KV head) the compiler fused the softmax backward's row sum over the keys with
    ``dO V^T`` into one kernel it failed to lower; this backward compiles whole at tiny and
    Qwen3-30B-A3B widths (experiments/2026-11-30-rngd-attention-split.md). Outputs bitwise equal
    to the eager formulation; gradients equal to fp32 rounding (1e-7 relative, measured)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        scaling: float,
    ) -> torch.Tensor:
        n_rep = q.shape[1] // k.shape[1]
        kk, vv = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        s = torch.matmul(q, kk.transpose(2, 3)) * scaling
        if mask is not None:
            s = s + mask
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(p, vv)
        ctx.save_for_backward(q, kk, vv, p, o)
        ctx.scaling, ctx.n_rep = scaling, n_rep
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor):  # type: ignore[override]
        q, kk, vv, p, o = ctx.saved_tensors
        B, H, S, d = q.shape
        r = ctx.n_rep
        dv_full = torch.matmul(p.transpose(2, 3), do)
        dp = torch.matmul(do, vv.transpose(2, 3))
        ones = torch.ones(d, 1, dtype=torch.float32, device=do.device)
        D = torch.matmul(do.float() * o.float(), ones)
        ds = (p.float() * (dp.float() - D)).to(q.dtype)
        dq = torch.matmul(ds, kk) * ctx.scaling
        dk_full = torch.matmul(ds.transpose(2, 3), q) * ctx.scaling
        dk = dk_full.view(B, H // r, r, S, d).sum(2)
        dv = dv_full.view(B, H // r, r, S, d).sum(2)
        return dq, dk, dv, None, None


def eager_attention(
    q_BHSd: torch.Tensor,
    k_BKSd: torch.Tensor,
    v_BKSd: torch.Tensor,
    mask_B1SS: torch.Tensor | None,
    scaling: float,
) -> tuple[torch.Tensor, None]:
    """transformers' ``eager_attention_forward`` (no dropout) as ``_AttentionCore``.

    Returns ``(o_BSHd, None)`` (output transposed back to ``[B, S, H, d]`` and contiguous; the
    attention weights are not returned)."""
    o_BHSd = _AttentionCore.apply(q_BHSd, k_BKSd, v_BKSd, mask_B1SS, scaling)
    return o_BHSd.transpose(1, 2).contiguous(), None


def sdpa_attention(
    q_BHSd: torch.Tensor,
    k_BKSd: torch.Tensor,
    v_BKSd: torch.Tensor,
    mask_B1SS: torch.Tensor | None,
    scaling: float,
) -> tuple[torch.Tensor, None]:
    """``eager_attention``'s contract through ``F.scaled_dot_product_attention`` (additive mask,
    GQA without repeating K/V): torch's flash-attention kernel on cpu, flash/memory-efficient on
    cuda, which never hold the ``[B, H, S, S]`` scores; for long rows (``api.sizing``). Equal to
    the eager core to rounding (the softmax is computed blockwise, online). ``mask_B1SS`` None:
    plain causal (``is_causal``: the kernel skips the key blocks above the diagonal)."""
    o_BHSd = F.scaled_dot_product_attention(
        q_BHSd,
        k_BKSd,
        v_BKSd,
        attn_mask=mask_B1SS,
        scale=scaling,
        enable_gqa=True,
        is_causal=mask_B1SS is None,  # plain causal rows (graphs.attention_mask_input)
    )
    return o_BHSd.transpose(1, 2).contiguous(), None


def logsumexp_rngd(z: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """``torch.logsumexp(z, dim, keepdim)`` as amax/sub/exp/sum/log/add (no ``aten.logsumexp``).

    The max shift is detached: ``d/dz [m + log sum exp(z - m)]`` does not depend on ``m``, so
    the gradient is exactly ``softmax(z)`` either way, and no ``amax`` backward is traced."""
    m = z.detach().amax(dim=dim, keepdim=True)
    out = m + torch.log(torch.exp(z - m).sum(dim=dim, keepdim=True))
    return out if keepdim else out.squeeze(dim)


def cross_entropy_int32(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    label_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-row cross-entropy ``logsumexp(z) - z[label]`` with int32 ``labels`` picked by an int32
    compare against ``arange(V, dtype=int32)`` (no gather, no int64). ``weights`` (same shape as
    ``labels``) gives ``sum(w * ce)``; without it the per-row losses are returned.
    ``label_logits``: ``z[label]`` computed by the caller (``head_label_logits``); then the
    one-hot pick ``sum(z * onehot)`` over V is not traced. At Qwen3 widths (V = 151,936) RNGD's
    compiler fails to lower that fused mul + reduce (experiments/2026-11-30-rngd-attention-split.md)."""
    z = logits.float()
    if label_logits is None:
        vocab = torch.arange(z.shape[-1], dtype=torch.int32, device=z.device)
        onehot = (vocab == labels[..., None]).to(z.dtype)
        label_logits = (z * onehot).sum(-1)
    ce = logsumexp_rngd(z, dim=-1) - label_logits.float()
    return ce if weights is None else (ce * weights.float()).sum()


def head_label_logits(
    hn_BND: torch.Tensor, weight_VD: torch.Tensor, labels_BN: torch.Tensor
) -> torch.Tensor:
    """``(hn @ W^T)[label]`` as ``hn · W[label]``: the label rows of the LM head's weight gathered
    with an int32 embedding lookup (which compiles on RNGD), a dot product over D (fp32
    accumulation), rounded to the logits' dtype as the matmul's output is. Only for a frozen
    weight: its gradient would be an index-add."""
    w_BND = F.embedding(labels_BN, weight_VD)
    return (hn_BND.float() * w_BND.float()).sum(-1).to(hn_BND.dtype)
