"""Device-side modules: what runs on the accelerator, written to compile with static shapes.

Legend (shape suffixes)::

    B  batch (sequences)            S  sequence length          D  hidden size (model width)
    N  label positions per sequence, padded to a bucket          V  vocabulary
    Eh hot experts of a layer       Bk tokens per hot expert, padded to a bucket
    F  2 * I (gate and up projections fused)                     I  expert intermediate size
    d  attention head dim

Compile rules these modules follow (measured with furiosa-torch 2026.4, see NOTES.md):
- no int64 tensor ops on the device: token ids, positions and labels arrive as **int32**;
- no ``sort``/``argmax``/``nonzero``/``index_add``/``index_put(accumulate)``/``cumsum``/grouped
  mm: all routing, gathering and dispatch happen on the host; the device gets dense tensors;
- attention is the stock *eager* attention (no sdpa), written out in ``DeviceAttentionBlock``,
  its core (scores, fp32 softmax, @ values) an autograd Function with a FlashAttention-style
  backward (``ops.eager_attention``: fp32 ``_softmax_backward_data`` does not compile, and at
  Qwen3 widths the softmax backward's row sum fused with dO·Vᵀ fails to lower); the causal + padding mask is built on the host as an additive float tensor
  (``causal_mask``) and passed in; v is computed per head (``headwise_linear``) and rope's
  ``rotate_half`` is a matmul by a signed permutation (``rotate_half_matrix``): the transposed
  LoRA-scaling kernel and the slice/cat backward of the stock forms fail RNGD's compiler;
- the head's cross-entropy is ``ops.cross_entropy_int32`` (``logsumexp`` does not compile);
- these formulations are used on every backend: the CPU engine runs the graphs that compile;
- gathers whose backward would be an ``index_add`` are one-hot matmuls (``bmm``), exact in fp32;
- the LM head runs only at the label positions (never full-sequence logits).

The decoder layer is split so that the MoE block's input and output cross cleanly::

    h_BSD (+ moe_BSD of the previous layer) ─ DeviceAttentionBlock ─► (h_mid_BSD, x_BSD)
    x_BSD ─ host: HostMLP (router + experts; hot experts via HotExpertsBatched) ─► moe_BSD
    next layer: h_mid_BSD + moe_BSD → ... → DeviceHead(h_mid_BSD, moe_BSD, ...)

so the residual add of the MoE output happens on the device, inside the next compiled graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from npu_lora.api.sizing import (
    HEAD_CHUNK_BYTES,
    attention_impl,
    head_chunk_rows,
    head_loss_blocks,
    head_vocab_rows,
    label_bucket,
    label_gather_impl,
    rope_impl,
)

from .ops import (
    cross_entropy_int32,
    eager_attention,
    head_label_logits,
    logsumexp_rngd,
    sdpa_attention,
)

# ---------------------------------------------------------------------------------------------
# host-side input builders (run on the host; their outputs are copied to the device)


def causal_mask(
    attention_mask_BS: torch.Tensor | None,
    B: int,
    S: int,
    dtype: torch.dtype,
    position_ids_BS: torch.Tensor | None = None,
) -> torch.Tensor:
    """Additive mask ``[B, 1, S, S]``: 0 where query t may attend key s (s <= t and key s is a
    real token), ``finfo(dtype).min`` elsewhere — the same values transformers' eager mask has.

    ``position_ids_BS`` (packed rows, ``data.packing``): a new example starts wherever the
    position is 0, and t may attend s only inside the same example (block-diagonal causal, as
    transformers' ``find_packed_sequence_indices`` reads packed position ids). Built on the
    host: the device graph's inputs keep their shapes."""
    causal_SS = torch.ones(S, S, dtype=torch.bool).tril()
    allowed = causal_SS[None, None].expand(B, 1, S, S)
    if attention_mask_BS is not None:
        allowed = allowed & attention_mask_BS.to(torch.bool)[:, None, None, :]
    if position_ids_BS is not None:
        seg_BS = (position_ids_BS == 0).cumsum(dim=1)
        allowed = allowed & (seg_BS[:, None, :, None] == seg_BS[:, None, None, :])
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.tensor(torch.finfo(dtype).min, dtype=dtype))


def attention_mask_input(
    attention_mask_BS: torch.Tensor | None,
    B: int,
    S: int,
    dtype: torch.dtype,
    position_ids_BS: torch.Tensor | None,
    backend: str,
) -> torch.Tensor | None:
    """The ``mask_B1SS`` the attention blocks get: ``None`` where the block runs sdpa
    (``api.sizing.attention_impl``) and the mask would be plain causal (every token real, one
    example a row), so sdpa runs ``is_causal`` and skips the key blocks above the diagonal
    (half the scores of an additive mask, which the kernel must compute whole); else
    :func:`causal_mask`. transformers' own sdpa path drops an all-ones mask the same way."""
    plain = position_ids_BS is None and (attention_mask_BS is None or bool(attention_mask_BS.all()))
    if plain and attention_impl(backend, S) == "sdpa":
        return None
    return causal_mask(attention_mask_BS, B, S, dtype, position_ids_BS)


def positions(B: int, S: int, position_ids_BS: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, S] int32`` positions 0..S-1 (what transformers uses without a cache), or the given
    ``position_ids_BS`` (packed rows: restarting at 0 per example, so RoPE matches unpacked)."""
    if position_ids_BS is not None:
        return position_ids_BS.to(torch.int32).contiguous()
    return torch.arange(S, dtype=torch.int32)[None].expand(B, S).contiguous()


@dataclass
class LabelGather:
    """Label positions of a batch (HF convention: logits at t predict ``labels[t + 1]``).

    ``sel_BNS`` one-hot rows selecting the positions t whose next label is not -100 (zero rows
    pad each sequence to N), ``labels_BN`` int32 targets (0 on padding), ``w_BN`` loss weights
    (1 / #labels on real rows, 0 on padding), so ``loss = sum(w * ce)`` is the mean CE."""

    sel_BNS: torch.Tensor
    labels_BN: torch.Tensor
    w_BN: torch.Tensor
    count: int


def label_gather(
    labels_BS: torch.Tensor, dtype: torch.dtype, *, n_bucket: int | None = None
) -> LabelGather:
    """Build the head's gather inputs on the host. N = ``n_bucket`` or the next power of two of
    the largest per-sequence label count (capped at S), so shapes repeat across batches."""
    B, S = labels_BS.shape
    tgt_BS = torch.full_like(labels_BS, -100)
    tgt_BS[:, :-1] = labels_BS[:, 1:]  # logits at t predict labels[t + 1]
    valid_BS = tgt_BS != -100
    per_row = valid_BS.sum(1)
    count = int(per_row.sum())
    n_max = int(per_row.max()) if B else 0
    N = n_bucket if n_bucket is not None else label_bucket(n_max, S)  # api.sizing
    if n_max > N:
        raise ValueError(f"label bucket {N} < {n_max} label positions in a sequence")
    sel_BNS = torch.zeros(B, N, S, dtype=dtype)
    labels_BN = torch.zeros(B, N, dtype=torch.int32)
    w_BN = torch.zeros(B, N, dtype=torch.float32)
    inv = 1.0 / max(count, 1)
    for b in range(B):
        pos = valid_BS[b].nonzero().squeeze(1)
        n = pos.numel()
        sel_BNS[b, torch.arange(n), pos] = 1.0
        labels_BN[b, :n] = tgt_BS[b, pos].to(torch.int32)
        w_BN[b, :n] = inv
    return LabelGather(sel_BNS, labels_BN, w_BN, count)


# ---------------------------------------------------------------------------------------------
# device modules


class DeviceEmbed(nn.Module):
    """``ids_BS int32 → h_BSD``: the token embedding lookup (weights shared with the model)."""

    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, ids_BS: torch.Tensor) -> torch.Tensor:
        e = self.embed_tokens
        return F.embedding(ids_BS, e.weight, e.padding_idx)


class DeviceAttentionBlock(nn.Module):
    """One decoder layer minus its MoE block (modules shared with the HF layer, LoRA included).

    forward(h_BSD, moe_BSD, pos_BS int32, mask_B1SS) -> (h_mid_BSD, x_BSD)::

        h     = h_BSD + moe_BSD                       # residual add of the previous MoE output
        cos, sin = rope(pos_BS)                       # int32 positions → float on the device
        h_mid = h + self_attn(input_layernorm(h))     # eager attention, additive mask
        x     = post_attention_layernorm(h_mid)       # the MoE block's input (goes to the host)
    """

    def __init__(
        self,
        input_layernorm: nn.Module,
        self_attn: nn.Module,
        post_attention_layernorm: nn.Module,
        rotary_emb: nn.Module,
        backend: str = "furiosa",
    ) -> None:
        super().__init__()
        #: the backend's registry name: rows of ``api.sizing.SDPA_MIN_SEQ`` tokens and more run
        #: sdpa where the backend allows it (``api.sizing.attention_impl``), else the eager core
        self.backend = backend
        self.input_layernorm = input_layernorm
        self.self_attn = self_attn
        self.post_attention_layernorm = post_attention_layernorm
        self.register_buffer("inv_freq", rotary_emb.inv_freq.detach().clone(), persistent=False)
        self.attention_scaling = float(rotary_emb.attention_scaling)
        w = input_layernorm.weight  # the block's activation dtype
        self.register_buffer(
            "rot_dd", rotate_half_matrix(self_attn.head_dim, w.dtype, w.device), persistent=False
        )

    @classmethod
    def from_layer(
        cls, layer: nn.Module, rotary_emb: nn.Module, backend: str = "furiosa"
    ) -> DeviceAttentionBlock:
        return cls(
            layer.input_layernorm,
            layer.self_attn,
            layer.post_attention_layernorm,
            rotary_emb,
            backend,
        )

    def rope(self, pos_BS: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs_BSd = pos_BS[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs_BSd, freqs_BSd), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)

    def forward(
        self,
        h_BSD: torch.Tensor,
        moe_BSD: torch.Tensor,
        pos_BS: torch.Tensor,
        mask_B1SS: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``mask_B1SS`` None: plain causal, sdpa rows only (``attention_mask_input``)."""
        h = h_BSD + moe_BSD
        cos, sin = self.rope(pos_BS, h.dtype)
        h_mid = h + self.attend(self.input_layernorm(h), cos, sin, mask_B1SS)
        return h_mid, self.post_attention_layernorm(h_mid)

    def attend(
        self,
        x_BSD: torch.Tensor,
        cos_BSd: torch.Tensor,
        sin_BSd: torch.Tensor,
        mask_B1SS: torch.Tensor | None,
    ) -> torch.Tensor:
        """``Qwen3MoeAttention.forward`` (transformers 5.x, eager, no cache) written out with the
        module's own q/k/v/o projections (peft LoRA included) and q/k norms::

            q = rope(q_norm(q_proj(x)))  k = rope(k_norm(k_proj(x)))  v = v_proj(x)   per head
            rope(x) = x * cos + (x @ R) * sin           # R = rotate_half_matrix(d)
            o = o_proj(softmax(q k^T * scaling + mask, fp32) v)   # ops.eager_attention
                                                        # (long rows on cpu/cuda: ops.sdpa_attention)

        Same arithmetic as the stock module (outputs bitwise equal in fp32 and bf16, tested);
        the attention core's backward is ``ops.eager_attention``'s (FlashAttention-style, no
        ``_softmax_backward_data``).
        RNGD (furiosa-torch 2026.4): with v per head and rotate_half as a matmul, forward and
        backward compile whole (experiments/2026-11-30-rngd-attention-split.md: with the
        slice/cat rotate_half the backward failed in the compiler's scheduler, "... is used
        without wait"; split into parts, only the norm+rope part failed, and the matmul form
        fixed it)."""
        sa = self.self_attn
        if sa.training and sa.attention_dropout > 0.0:
            raise NotImplementedError("attention dropout on the device (Qwen3-MoE uses 0.0)")
        B, S, _ = x_BSD.shape
        d = sa.head_dim
        q_BHSd = sa.q_norm(sa.q_proj(x_BSD).view(B, S, -1, d)).transpose(1, 2)
        k_BKSd = sa.k_norm(sa.k_proj(x_BSD).view(B, S, -1, d)).transpose(1, 2)
        # v per head straight from the projection, not view + transpose: with the transpose, the
        # backward fuses "transpose dV, x LoRA scaling" into one elementwise kernel that RNGD's
        # compiler fails to verify (experiments/2026-11-30-rngd-compile-tiny.md, attempts).
        v_BKSd = headwise_linear(sa.v_proj, x_BSD, d)
        cos, sin = cos_BSd[:, None], sin_BSd[:, None]
        if rope_impl(self.backend) == "slice":  # cpu, cuda: the stock form (no d x d matmuls)
            q_BHSd = q_BHSd * cos + rotate_half(q_BHSd) * sin
            k_BKSd = k_BKSd * cos + rotate_half(k_BKSd) * sin
        else:
            # rotate_half as a matmul by a fixed signed permutation (bitwise the same values):
            # the slice/neg/cat backward of rotate_half fails RNGD's scheduler, the matmul
            # compiles.
            rot = self.rot_dd.to(q_BHSd.dtype)
            q_BHSd = q_BHSd * cos + torch.matmul(q_BHSd, rot) * sin
            k_BKSd = k_BKSd * cos + torch.matmul(k_BKSd, rot) * sin
        core = sdpa_attention if attention_impl(self.backend, S) == "sdpa" else eager_attention
        if mask_B1SS is None and core is eager_attention:
            raise ValueError(f"attention at S={S} on {self.backend}: the eager core needs a mask")
        o_BSHd, _ = core(q_BHSd, k_BKSd, v_BKSd, mask_B1SS, sa.scaling)
        return sa.o_proj(o_BSHd.reshape(B, S, -1))


def headwise_linear(linear: nn.Module, x_BSD: torch.Tensor, d: int) -> torch.Tensor:
    """``linear(x).view(B, S, K, d).transpose(1, 2)`` computed per head as
    ``x @ W.view(K, d, D)^T`` (``[B, K, S, d]`` out; no transpose of the activations in the
    forward or the backward). ``linear`` is an ``nn.Linear`` or a peft LoRA ``Linear``: its active
    adapters add ``(dropout(x) @ A^T) @ B.view(K, d, r)^T * scaling`` per head, as peft's forward
    adds ``lora_B(lora_A(dropout(x))) * scaling``, in the adapter's dtype, and casts the sum back to
    the base layer's (bf16 base, fp32 adapter: bf16 out, as peft). Same products and sums as the plain linear
    (fp32 outputs equal to ~1e-7; tested against the stock module)."""
    base = getattr(linear, "base_layer", linear)
    if not isinstance(base, nn.Linear):
        raise TypeError(f"headwise_linear needs an nn.Linear (or peft LoRA Linear), not {base!r}")
    W_KdD = base.weight.view(-1, d, base.in_features)
    K = W_KdD.shape[0]
    y_BKSd = torch.matmul(x_BSD[:, None], W_KdD.transpose(1, 2))
    if base.bias is not None:
        y_BKSd = y_BKSd + base.bias.view(K, 1, d)
    lora_A = getattr(linear, "lora_A", None)
    if lora_A is None or getattr(linear, "disable_adapters", False):
        return y_BKSd
    if getattr(linear, "merged", False):
        raise NotImplementedError("headwise_linear on a merged LoRA layer")
    out_dtype = y_BKSd.dtype  # peft casts the sum back to the base layer's dtype
    for name in linear.active_adapters:
        if name not in lora_A:
            continue
        if linear.use_dora.get(name, False):
            raise NotImplementedError("headwise_linear with DoRA")
        A_rD = lora_A[name].weight
        B_Kdr = linear.lora_B[name].weight.view(K, d, -1)
        a_BSr = F.linear(linear.lora_dropout[name](x_BSD).to(A_rD.dtype), A_rD)
        lora_BKSd = torch.matmul(a_BSr[:, None], B_Kdr.transpose(1, 2))
        y_BKSd = y_BKSd + lora_BKSd * linear.scaling[name]
    return y_BKSd.to(out_dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' ``rotate_half``: ``cat(-x[..., d/2:], x[..., :d/2])``."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate_half_matrix(
    d: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """``R [d, d]`` with ``x @ R == rotate_half(x) == cat(-x[..., d/2:], x[..., :d/2])``.

    Entries are 0, +1, -1, so every output element is one input element (negated or not) plus
    exact zeros: the product equals ``rotate_half`` bit for bit in any float dtype (tested).
    Its backward is ``g @ R^T`` (a matmul) instead of slices, a negation and a concatenation."""
    h = d // 2
    R = torch.zeros(d, d, dtype=dtype, device=device)
    eye = torch.eye(h, dtype=dtype, device=device)
    R[h:, :h] = -eye  # out[..., :h] = -x[..., h:]
    R[:h, h:] = eye  # out[..., h:] = x[..., :h]
    return R


class DeviceHead(nn.Module):
    """Final norm + LM head + cross-entropy, only at the label positions.

    forward(h_BSD, moe_BSD, sel_BNS, labels_BN int32, w_BN) -> loss (fp32 scalar)::

        h      = h_BSD + moe_BSD
        hs_BND = bmm(sel_BNS, h)                   # one-hot gather: exact; backward is a bmm
        hn_BND = norm(hs_BND)
        z_BNV  = lm_head(hn_BND).float()           # logits only at N positions, never B*S
        zl_BN  = hn · W[label]                     # ops.head_label_logits: int32 embedding
                                                   # lookup of the label rows (frozen plain head;
                                                   # else an int32 one-hot compare over V)
        ce_BN  = logsumexp(z) - zl                 # ops.cross_entropy_int32, logsumexp written
                                                   # out (ops.logsumexp_rngd)
        loss   = sum(w_BN * ce_BN)                 # w = 1/#labels (0 on padding) → mean CE

    ``linear(x, W)``: how the frozen plain head computes ``x Wᵀ`` (``Backend.frozen_linear``;
    ``None``: ``lm_head(x)``). The ``cpu`` backend passes the streaming kernel.
    """

    def __init__(
        self,
        norm: nn.Module,
        lm_head: nn.Module,
        vocab_size: int,
        linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        chunk_bytes: int = HEAD_CHUNK_BYTES,
        backend: str = "furiosa",
    ) -> None:
        super().__init__()
        #: the backend's registry name: how a long row's loss is chunked
        #: (``api.sizing.head_loss_blocks``: vocabulary blocks on cpu/cuda, positions on furiosa)
        self.backend = backend
        self.norm = norm
        self.lm_head = lm_head
        self.vocab_size = vocab_size
        self.linear = linear
        #: the most bytes of fp32 logits held at once (``api.sizing.head_chunk_rows``)
        self.chunk_bytes = chunk_bytes

    def gather(self, sel_BNS: torch.Tensor, h_BSD: torch.Tensor) -> torch.Tensor:
        """``bmm(sel, h)``: the label positions' rows (zero rows where ``sel`` is). On backends
        that take index gathers (``label_gather_impl``: cpu, cuda) as ``torch.gather`` at each
        row's one position (backward a scatter-add), exact as the one-hot matmul and without its
        ``B·N·S·D`` multiply-adds each way (4.3 GFLOP at S=2,048, N=512, Qwen3 widths); on
        furiosa the one-hot ``bmm`` the compiler takes."""
        if label_gather_impl(self.backend) == "onehot":
            return torch.bmm(sel_BNS.to(h_BSD.dtype), h_BSD)
        B, N, _ = sel_BNS.shape
        idx_BN = sel_BNS.argmax(dim=-1)
        hs_BND = torch.gather(h_BSD, 1, idx_BN[..., None].expand(B, N, h_BSD.shape[-1]))
        return hs_BND * (sel_BNS.sum(dim=-1, keepdim=True) > 0).to(h_BSD.dtype)

    def logits(
        self, h_BSD: torch.Tensor, moe_BSD: torch.Tensor, sel_BNS: torch.Tensor
    ) -> torch.Tensor:
        h = h_BSD + moe_BSD
        hs_BND = self.gather(sel_BNS, h)
        return self.lm_head(self.norm(hs_BND)).float()

    def forward(
        self,
        h_BSD: torch.Tensor,
        moe_BSD: torch.Tensor,
        sel_BNS: torch.Tensor,
        labels_BN: torch.Tensor,
        w_BN: torch.Tensor | None,
    ) -> torch.Tensor:
        lm = self.lm_head
        plain = type(lm) is nn.Linear and lm.bias is None and not lm.weight.requires_grad
        B, N, _ = sel_BNS.shape
        rows = head_chunk_rows(B, N, self.vocab_size, self.chunk_bytes)
        if rows < N:  # long rows: never all N label positions' logits at once
            h = h_BSD + moe_BSD
            hn_BND = self.norm(self.gather(sel_BNS, h))
            return self._chunked(hn_BND, labels_BN, w_BN, rows, plain)
        if not plain:  # LoRA-wrapped or trained head: pick the label logit from z (one-hot)
            return cross_entropy_int32(self.logits(h_BSD, moe_BSD, sel_BNS), labels_BN, w_BN)
        h = h_BSD + moe_BSD
        hn_BND = self.norm(self.gather(sel_BNS, h))
        z_BNV = (lm(hn_BND) if self.linear is None else self.linear(hn_BND, lm.weight)).float()
        picked_BN = head_label_logits(hn_BND, lm.weight, labels_BN)
        return cross_entropy_int32(z_BNV, labels_BN, w_BN, label_logits=picked_BN)

    def _chunked(
        self,
        hn_BND: torch.Tensor,
        labels_BN: torch.Tensor,
        w_BN: torch.Tensor | None,
        rows: int,
        plain: bool,
    ) -> torch.Tensor:
        """The loss ``rows`` label positions at a time. A frozen plain head with weights (the
        training loss): ``_ChunkedHeadCE``, which forms each chunk's gradient while its logits
        exist (no logits kept for backward, no recompute); on backends whose form is
        ``"vocab"`` (``api.sizing.head_loss_blocks``: cpu, cuda) ``_VocabBlockedHeadCE``
        instead, every position at once against blocks of the vocabulary. Otherwise (a LoRA-wrapped or trained
        head; the per-position losses of evaluation): each chunk under activation
        checkpointing (its logits recomputed, one chunk at a time, in backward)."""
        lm = self.lm_head
        if plain and w_BN is not None and head_loss_blocks(self.backend) == "vocab":
            B, N, _ = hn_BND.shape
            block = head_vocab_rows(B * N, self.vocab_size, self.chunk_bytes)
            return _VocabBlockedHeadCE.apply(hn_BND, lm.weight, labels_BN, w_BN, block)
        if plain and w_BN is not None:
            return _ChunkedHeadCE.apply(hn_BND, lm.weight, labels_BN, w_BN, rows, self.linear)

        def one(hn: torch.Tensor, lab: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
            z = (lm(hn) if not plain or self.linear is None else self.linear(hn, lm.weight)).float()
            picked = head_label_logits(hn, lm.weight, lab) if plain else None
            return cross_entropy_int32(z, lab, w, label_logits=picked)

        parts = []
        for c in range(0, hn_BND.shape[1], rows):
            sl = slice(c, c + rows)
            w = None if w_BN is None else w_BN[:, sl]
            args = (hn_BND[:, sl], labels_BN[:, sl], w)
            if torch.is_grad_enabled():
                parts.append(checkpoint(one, *args, use_reentrant=False))
            else:
                parts.append(one(*args))
        return torch.cat(parts, dim=1) if w_BN is None else torch.stack(parts).sum()


def _saved_input_grad(ctx: Any, g: torch.Tensor) -> torch.Tensor | None:
    """Backward of a head loss whose input gradient ``dhn [B, N, D]`` (fp32) was formed in its
    forward and saved: ``dhn · g`` in the hidden states' dtype (None where no input needs it)."""
    (dhn_BND,) = ctx.saved_tensors
    if not ctx.needs_input_grad[0]:
        return None
    return (dhn_BND * g.float()).to(ctx.hn_dtype)


class _ChunkedHeadCE(torch.autograd.Function):
    """``sum(w * (logsumexp(hn Wᵀ) - hn·W[label]))`` for a frozen head ``W [V, D]``, ``rows``
    label positions at a time (``api.sizing.head_chunk_rows``). Each chunk's logits
    ``z [B, rows, V]`` (fp32) live only inside its iteration: the loss's gradient in ``z`` is
    known in the forward (``dz = w · softmax(z)``; the label term's gradient is ``-w · W[label]``),
    so the chunk's ``dhn = dz W - w · W[label]`` is formed there and only ``dhn [B, N, D]``
    is kept; backward scales it by the incoming gradient. Same products as the unchunked head
    (``dz`` rounded to the weight's dtype before ``dz W``, as autograd's backward of the
    ``.float()`` cast does); gradients equal to rounding (tested)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hn_BND: torch.Tensor,
        weight_VD: torch.Tensor,
        labels_BN: torch.Tensor,
        w_BN: torch.Tensor,
        rows: int,
        linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    ) -> torch.Tensor:
        loss = torch.zeros((), dtype=torch.float32, device=hn_BND.device)
        need = ctx.needs_input_grad[0]
        dhn_BND = torch.empty(hn_BND.shape, dtype=torch.float32, device=hn_BND.device)
        for c in range(0, hn_BND.shape[1], rows):
            sl = slice(c, c + rows)
            hn, lab, w = hn_BND[:, sl], labels_BN[:, sl], w_BN[:, sl].float()
            z = (F.linear(hn, weight_VD) if linear is None else linear(hn, weight_VD)).float()
            lse = logsumexp_rngd(z, dim=-1)
            picked = head_label_logits(hn, weight_VD, lab).float()
            loss = loss + ((lse - picked) * w).sum()
            if need:
                dz = torch.exp(z.sub_(lse[..., None])).mul_(w[..., None])  # w · softmax(z)
                w_lab = F.embedding(lab, weight_VD).float()
                d = torch.matmul(dz.to(weight_VD.dtype), weight_VD).float()
                dhn_BND[:, sl] = d - w[..., None] * w_lab
                del dz
            del z
        ctx.save_for_backward(dhn_BND if need else torch.empty(0))
        ctx.hn_dtype = hn_BND.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        return _saved_input_grad(ctx, g), None, None, None, None, None


class _VocabBlockedHeadCE(torch.autograd.Function):
    """``_ChunkedHeadCE``'s loss and gradient with the chunks cut across the vocabulary: all
    ``M = B·N`` label positions against ``block`` weight rows at a time
    (``api.sizing.head_vocab_rows``: the block's fp32 logits ``[M, block]`` within the same byte
    budget), so the weight is read once and every matmul has all positions as its rows (position
    chunks of 64 re-read the 1.2 GB Qwen3 head twice a chunk, in skinny matmuls). Per block, with
    the running max ``m`` and sum ``l`` of an online log-sum-exp (FlashAttention's rule)::

        z = hn Wbᵀ              m' = max(m, rowmax z)        a = exp(m - m')
        p = exp(z - m')         l  = a·l + rowsum p          acc = a·acc + p Wb
        → lse = m + log l,  dhn = w · acc / l - w · W[label]   (= w·softmax(z) W - w·W[label])

    Only ``dhn [B, N, D]`` is kept for backward, as in ``_ChunkedHeadCE``. Same products as the
    unchunked head in a different summation order (``p`` rounded to the weight's dtype before
    ``p Wb``, as the unchunked backward rounds ``dz``); gradients equal to rounding (tested)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hn_BND: torch.Tensor,
        weight_VD: torch.Tensor,
        labels_BN: torch.Tensor,
        w_BN: torch.Tensor,
        block: int,
    ) -> torch.Tensor:
        B, N, D = hn_BND.shape
        x_MD = hn_BND.reshape(B * N, D)
        w_M = w_BN.reshape(B * N).float()
        need = ctx.needs_input_grad[0]
        dev = hn_BND.device
        m_M = torch.full((B * N,), -torch.inf, dtype=torch.float32, device=dev)
        l_M = torch.zeros(B * N, dtype=torch.float32, device=dev)
        acc_MD = torch.zeros(B * N, D, dtype=torch.float32, device=dev) if need else None
        for v0 in range(0, weight_VD.shape[0], block):
            w_bD = weight_VD[v0 : v0 + block]
            z = F.linear(x_MD, w_bD).float()  # [M, block]: the only logits alive
            m_new = torch.maximum(m_M, z.amax(dim=1))
            alpha = torch.exp(m_M - m_new)  # 0 on the first block (m = -inf)
            p = z.sub_(m_new[:, None]).exp_()
            l_M = l_M * alpha + p.sum(dim=1)
            if acc_MD is not None:
                acc_MD.mul_(alpha[:, None])
                if weight_VD.dtype == torch.float32:
                    acc_MD.addmm_(p, w_bD)
                else:
                    acc_MD.add_(torch.mm(p.to(weight_VD.dtype), w_bD).float())
            m_M = m_new
            del z, p
        lse_M = m_M + torch.log(l_M)
        picked_M = head_label_logits(hn_BND, weight_VD, labels_BN).float().reshape(B * N)
        loss = ((lse_M - picked_M) * w_M).sum()
        dhn_BND = torch.empty(0)
        if acc_MD is not None:
            w_lab = F.embedding(labels_BN.reshape(B * N), weight_VD).float()
            dhn_BND = (acc_MD.mul_((w_M / l_M)[:, None]) - w_M[:, None] * w_lab).view(B, N, D)
        ctx.save_for_backward(dhn_BND)
        ctx.hn_dtype = hn_BND.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        return _saved_input_grad(ctx, g), None, None, None, None


class DeviceHeadNLL(nn.Module):
    """``DeviceHead`` without the reduction (evaluation): ``ce_BN``, the cross-entropy of each
    gathered label position (``-log p(label)``, fp32). Same weights, same kernels as training's
    head; padded positions (``labels_BN`` 0, nothing selected) hold garbage the caller masks."""

    def __init__(self, head: DeviceHead) -> None:
        super().__init__()
        self.head = head

    def forward(
        self,
        h_BSD: torch.Tensor,
        moe_BSD: torch.Tensor,
        sel_BNS: torch.Tensor,
        labels_BN: torch.Tensor,
    ) -> torch.Tensor:
        return self.head(h_BSD, moe_BSD, sel_BNS, labels_BN, None)


class HotExpertsGathered(nn.Module):
    """``HotExpertsBatched`` between a gather and a scatter on the device:
    forward(x_TD, idx_EhB int32, r_EhB) -> y_TD = index_add(0, idx, hot(x_TD[idx], r)), the hot
    pairs' outputs summed per token. The host sends the block's T token rows once and gets T rows
    back, instead of the Eh·Bk padded rows each way (fewer whenever Eh·Bk > T); the backward
    (gather of dy, the experts, index_add into dx_TD) runs on the device too. Static shapes per
    bucket. On cuda the index_adds use atomics (run-to-run bitwise only under
    ``torch.use_deterministic_algorithms``). Not yet in the RNGD catalogue (the engine uses it
    on cpu/cuda only)."""

    def __init__(self, hot: HotExpertsBatched) -> None:
        super().__init__()
        self.hot = hot

    def forward(
        self, x_TD: torch.Tensor, idx_EhB: torch.Tensor, r_EhB: torch.Tensor
    ) -> torch.Tensor:
        Eh, Bk = r_EhB.shape
        idx = idx_EhB.reshape(-1)
        x_EhBD = x_TD.index_select(0, idx).view(Eh, Bk, x_TD.shape[-1])
        y_EhBD = self.hot(x_EhBD, r_EhB)  # padding rows: exactly 0 (weight 0)
        return torch.zeros_like(x_TD).index_add(0, idx, y_EhBD.reshape(Eh * Bk, -1))


class HotExpertsBatched(nn.Module):
    """A layer's hot experts in one padded batched call (SwiGLU experts × routing weight).

    forward(x_EhBD, r_EhB) -> y_EhBD; weights (frozen copies of the host experts)
    ``w_gate_up_EhFD [Eh, 2I, D]``, ``w_down_EhDI [Eh, D, I]``::

        g, u  = bmm(x, w_gate_up^T).chunk(2)       # [Eh, Bk, I] each
        y     = bmm(silu(g) * u, w_down^T) * r     # padding rows have r = 0 → y = 0

    Same arithmetic per (token, expert) pair as transformers' experts kernels (linear, gate,
    linear, × weight); only the GEMM reduction order may differ.
    Backward (autograd): dx = (dh_gate_up) @ w_gate_up, dr = <y_unweighted, dy>; the weights
    are buffers (no weight grads: hot placement excludes expert training). Saved by autograd:
    x, gate/up activations and the unweighted output, ≈ Eh·Bk·(D + 3I + D) values.
    """

    def __init__(self, w_gate_up_EhFD: torch.Tensor, w_down_EhDI: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w_gate_up_EhFD", w_gate_up_EhFD.detach().clone(), persistent=False)
        self.register_buffer("w_down_EhDI", w_down_EhDI.detach().clone(), persistent=False)

    @torch.no_grad()
    def load(self, w_gate_up_EhFD: torch.Tensor, w_down_EhDI: torch.Tensor) -> None:
        self.w_gate_up_EhFD.copy_(w_gate_up_EhFD)
        self.w_down_EhDI.copy_(w_down_EhDI)

    def forward(self, x_EhBD: torch.Tensor, r_EhB: torch.Tensor) -> torch.Tensor:
        h_EhBF = torch.bmm(x_EhBD, self.w_gate_up_EhFD.transpose(1, 2))
        g, u = h_EhBF.chunk(2, dim=-1)
        a_EhBI = F.silu(g) * u
        y_EhBD = torch.bmm(a_EhBI, self.w_down_EhDI.transpose(1, 2))
        return y_EhBD * r_EhB[..., None].to(y_EhBD.dtype)
