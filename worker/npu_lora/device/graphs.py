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

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .ops import cross_entropy_int32, eager_attention, head_label_logits

# ---------------------------------------------------------------------------------------------
# host-side input builders (run on the host; their outputs are copied to the device)


def causal_mask(
    attention_mask_BS: torch.Tensor | None, B: int, S: int, dtype: torch.dtype
) -> torch.Tensor:
    """Additive mask ``[B, 1, S, S]``: 0 where query t may attend key s (s <= t and key s is a
    real token), ``finfo(dtype).min`` elsewhere — the same values transformers' eager mask has."""
    causal_SS = torch.ones(S, S, dtype=torch.bool).tril()
    allowed = causal_SS[None, None].expand(B, 1, S, S)
    if attention_mask_BS is not None:
        allowed = allowed & attention_mask_BS.to(torch.bool)[:, None, None, :]
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.tensor(torch.finfo(dtype).min, dtype=dtype))


def positions(B: int, S: int) -> torch.Tensor:
    """``[B, S] int32`` positions 0..S-1 (what transformers uses without a cache)."""
    return torch.arange(S, dtype=torch.int32)[None].expand(B, S).contiguous()


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


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
    N = n_bucket if n_bucket is not None else min(max(next_pow2(n_max), 1), S)
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
    ) -> None:
        super().__init__()
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
    def from_layer(cls, layer: nn.Module, rotary_emb: nn.Module) -> DeviceAttentionBlock:
        return cls(
            layer.input_layernorm, layer.self_attn, layer.post_attention_layernorm, rotary_emb
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
        mask_B1SS: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = h_BSD + moe_BSD
        cos, sin = self.rope(pos_BS, h.dtype)
        h_mid = h + self.attend(self.input_layernorm(h), cos, sin, mask_B1SS)
        return h_mid, self.post_attention_layernorm(h_mid)

    def attend(
        self,
        x_BSD: torch.Tensor,
        cos_BSd: torch.Tensor,
        sin_BSd: torch.Tensor,
        mask_B1SS: torch.Tensor,
    ) -> torch.Tensor:
        """``Qwen3MoeAttention.forward`` (transformers 5.x, eager, no cache) written out with the
        module's own q/k/v/o projections (peft LoRA included) and q/k norms::

            q = rope(q_norm(q_proj(x)))  k = rope(k_norm(k_proj(x)))  v = v_proj(x)   per head
            rope(x) = x * cos + (x @ R) * sin           # R = rotate_half_matrix(d)
            o = o_proj(softmax(q k^T * scaling + mask, fp32) v)   # ops.eager_attention

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
        # rotate_half as a matmul by a fixed signed permutation (bitwise the same values): the
        # slice/neg/cat backward of rotate_half fails RNGD's scheduler, the matmul compiles.
        rot = self.rot_dd.to(q_BHSd.dtype)
        q_BHSd = q_BHSd * cos + torch.matmul(q_BHSd, rot) * sin
        k_BKSd = k_BKSd * cos + torch.matmul(k_BKSd, rot) * sin
        o_BSHd, _ = eager_attention(q_BHSd, k_BKSd, v_BKSd, mask_B1SS, sa.scaling)
        return sa.o_proj(o_BSHd.reshape(B, S, -1))


def headwise_linear(linear: nn.Module, x_BSD: torch.Tensor, d: int) -> torch.Tensor:
    """``linear(x).view(B, S, K, d).transpose(1, 2)`` computed per head as
    ``x @ W.view(K, d, D)^T`` (``[B, K, S, d]`` out; no transpose of the activations in the
    forward or the backward). ``linear`` is an ``nn.Linear`` or a peft LoRA ``Linear``: its active
    adapters add ``(dropout(x) @ A^T) @ B.view(K, d, r)^T * scaling`` per head, as peft's forward
    adds ``lora_B(lora_A(dropout(x))) * scaling``. Same products and sums as the plain linear
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
    return y_BKSd


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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


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
    """

    def __init__(self, norm: nn.Module, lm_head: nn.Module, vocab_size: int) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head
        self.vocab_size = vocab_size

    def logits(
        self, h_BSD: torch.Tensor, moe_BSD: torch.Tensor, sel_BNS: torch.Tensor
    ) -> torch.Tensor:
        h = h_BSD + moe_BSD
        hs_BND = torch.bmm(sel_BNS.to(h.dtype), h)
        return self.lm_head(self.norm(hs_BND)).float()

    def forward(
        self,
        h_BSD: torch.Tensor,
        moe_BSD: torch.Tensor,
        sel_BNS: torch.Tensor,
        labels_BN: torch.Tensor,
        w_BN: torch.Tensor,
    ) -> torch.Tensor:
        lm = self.lm_head
        plain = type(lm) is nn.Linear and lm.bias is None and not lm.weight.requires_grad
        if not plain:  # LoRA-wrapped or trained head: pick the label logit from z (one-hot)
            return cross_entropy_int32(self.logits(h_BSD, moe_BSD, sel_BNS), labels_BN, w_BN)
        h = h_BSD + moe_BSD
        hn_BND = self.norm(torch.bmm(sel_BNS.to(h.dtype), h))
        z_BNV = lm(hn_BND).float()
        picked_BN = head_label_logits(hn_BND, lm.weight, labels_BN)
        return cross_entropy_int32(z_BNV, labels_BN, w_BN, label_logits=picked_BN)


class HotExpertsBatched(nn.Module):
    """A layer's hot experts in one padded batched call (SwiGLU experts × routing weight).

    forward(x_EhBD, r_EhB) -> y_EhBD; weights (frozen copies of the host experts)
    ``w_gate_up_EhFD [Eh, 2I, D]``, ``w_down_EhDI [Eh, D, I]``::

        g, u  = bmm(x, w_gate_up^T).chunk(2)       # [Eh, Bk, I] each
        y     = bmm(silu(g) * u, w_down^T) * r     # padding rows have x = 0 and r = 0 → y = 0

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


# ---------------------------------------------------------------------------------------------
# graphs for compile checks


@dataclass
class DeviceGraph:
    """One device module with example inputs, for compile checks (RNGD) and numeric tests."""

    name: str
    module: nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    grad_inputs: tuple[int, ...]
    reference: Callable[..., object] | None


def _graph_config(widths: str):
    from npu_lora.models.presets import preset_config

    if widths == "tiny":
        cfg = preset_config("tiny-qwen3-moe")
    elif widths == "qwen3-30b-a3b":
        cfg = preset_config("qwen3-30b-a3b", layers=1)
    else:
        raise ValueError(f"widths must be 'tiny' or 'qwen3-30b-a3b', not {widths!r}")
    cfg._attn_implementation = "eager"
    return cfg


def _init_(module: nn.Module, std: float) -> None:
    for name, p in module.named_parameters():
        with torch.no_grad():
            if "norm" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, std)


class _AttnParts(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        from transformers.models.qwen3_moe.modeling_qwen3_moe import (
            Qwen3MoeAttention,
            Qwen3MoeRMSNorm,
        )

        self.input_layernorm = Qwen3MoeRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = Qwen3MoeAttention(cfg, 0)
        self.post_attention_layernorm = Qwen3MoeRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


def hot_reference(
    x_EhBD: torch.Tensor,
    r_EhB: torch.Tensor,
    w_gate_up_EhFD: torch.Tensor,
    w_down_EhDI: torch.Tensor,
) -> torch.Tensor:
    """Per-expert loop like transformers' ``eager`` experts kernel."""
    out = []
    for e in range(x_EhBD.shape[0]):
        g, u = F.linear(x_EhBD[e], w_gate_up_EhFD[e]).chunk(2, dim=-1)
        out.append(F.linear(F.silu(g) * u, w_down_EhDI[e]) * r_EhB[e, :, None])
    return torch.stack(out)


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
    from peft import LoraConfig, inject_adapter_in_model
    from transformers.models.qwen3_moe.modeling_qwen3_moe import (
        Qwen3MoeRMSNorm,
        Qwen3MoeRotaryEmbedding,
    )

    cfg = _graph_config(widths)
    gen = torch.manual_seed(seed)
    B, S, D, V = batch, seq_len, cfg.hidden_size, cfg.vocab_size
    std = cfg.initializer_range
    graphs: list[DeviceGraph] = []

    # embed
    embed = nn.Embedding(V, D).to(dtype)
    _init_(embed, std)
    ids = torch.randint(0, V, (B, S), generator=gen)
    graphs.append(
        DeviceGraph(
            "embed",
            DeviceEmbed(embed),
            (ids.to(torch.int32),),
            (),
            lambda ids_BS: embed(ids_BS.long()),
        )
    )

    # attention block (+ LoRA)
    parts = _AttnParts(cfg)
    _init_(parts, std)
    parts = inject_adapter_in_model(
        LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules=["q_proj", "v_proj"]), parts
    )
    for n, p in parts.named_parameters():  # non-zero LoRA B so the adapter path is exercised
        if "lora_B" in n:
            with torch.no_grad():
                p.normal_(0.0, std)
    parts.to(dtype)
    rotary = Qwen3MoeRotaryEmbedding(cfg)
    attn = DeviceAttentionBlock(
        parts.input_layernorm, parts.self_attn, parts.post_attention_layernorm, rotary
    )
    h = torch.randn(B, S, D, generator=gen, dtype=torch.float32).to(dtype)
    moe = (0.1 * torch.randn(B, S, D, generator=gen)).to(dtype)
    am = torch.ones(B, S, dtype=torch.long)
    mask = causal_mask(am, B, S, dtype)

    def attn_ref(h_BSD, moe_BSD, pos_BS, mask_B1SS):
        x = h_BSD + moe_BSD
        cos, sin = rotary(x, pos_BS.long())
        a, _ = parts.self_attn(
            hidden_states=parts.input_layernorm(x),
            position_embeddings=(cos, sin),
            attention_mask=mask_B1SS,
        )
        hm = x + a
        return hm, parts.post_attention_layernorm(hm)

    graphs.append(DeviceGraph("attention", attn, (h, moe, positions(B, S), mask), (0, 1), attn_ref))

    # head
    norm = Qwen3MoeRMSNorm(D, eps=cfg.rms_norm_eps).to(dtype)
    lm_head = nn.Linear(D, V, bias=False).to(dtype)
    _init_(norm, std)
    _init_(lm_head, std)
    norm.requires_grad_(False)  # frozen base weights, as in the engine (peft freezes them)
    lm_head.requires_grad_(False)
    head = DeviceHead(norm, lm_head, V)
    labels = torch.full((B, S), -100, dtype=torch.long)
    n_ans = max(S // 4 - 1, 1)
    labels[:, S - n_ans :] = torch.randint(0, V, (B, n_ans), generator=gen)
    lg = label_gather(labels, dtype, n_bucket=max(S // 4, 1))

    def head_ref(h_BSD, moe_BSD, sel_BNS, labels_BN, w_BN):
        z = lm_head(norm(h_BSD + moe_BSD)).float()  # full-sequence logits (the stock way)
        return F.cross_entropy(
            z[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100
        )

    graphs.append(
        DeviceGraph(
            "head",
            head,
            (h.detach().clone(), moe.detach().clone(), lg.sel_BNS, lg.labels_BN, lg.w_BN),
            (0, 1),
            head_ref,
        )
    )

    # hot experts
    E, inter = cfg.num_experts, cfg.moe_intermediate_size
    Eh = max(1, math.ceil(hot_fraction * E - 1e-9))
    w_gu = (std * torch.randn(Eh, 2 * inter, D, generator=gen)).to(dtype)
    w_dn = (std * torch.randn(Eh, D, inter, generator=gen)).to(dtype)
    hot = HotExpertsBatched(w_gu, w_dn)
    for bk in buckets or (seq_len,):
        x = torch.randn(Eh, bk, D, generator=gen).to(dtype)
        r = torch.rand(Eh, bk, generator=gen).to(dtype)
        fill = torch.arange(bk)[None] < torch.randint(1, bk + 1, (Eh, 1), generator=gen)
        x = x * fill[..., None]
        r = r * fill
        graphs.append(
            DeviceGraph(
                f"hot_experts_b{bk}",
                hot,
                (x, r),
                (0, 1),
                lambda x_EhBD, r_EhB, _w=(w_gu, w_dn): hot_reference(x_EhBD, r_EhB, *_w),
            )
        )
    return graphs
