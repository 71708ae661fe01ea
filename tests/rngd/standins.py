"""Small stand-in device graphs for testing the RNGD tooling itself.

They mirror the shapes of the real device graphs (``npu_lora.device.graphs``) closely enough to
exercise the tracer and the furiosa compile tiers, plus deliberately bad graphs (int64 ops,
denylisted ops) that the tracer must flag. Loaded by ``rngd-check --source`` as
``tests/rngd/standins.py:device_graphs``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class StandInGraph:
    name: str
    module: nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    trainable: list[Any] | None = None
    reference: Callable[..., Any] | None = None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class LoraLinear(nn.Module):
    def __init__(self, d_in: int, d_out: int, r: int = 0, alpha: float = 32.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / math.sqrt(d_in), requires_grad=False)
        self.r = r
        if r:
            self.lora_A = nn.Parameter(torch.randn(r, d_in) / math.sqrt(d_in))
            self.lora_B = nn.Parameter(torch.randn(d_out, r) * 0.01)
            self.scaling = alpha / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight.t()
        if self.r:
            y = y + (x @ self.lora_A.t()) @ self.lora_B.t() * self.scaling
        return y


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class AttentionBlock(nn.Module):
    """Qwen3-style: input norm, q/k/v (LoRA on q, v), per-head q/k norm, rotary from int32
    positions, eager GQA attention with an additive mask, o_proj, residual, post-attn norm."""

    def __init__(
        self, hidden: int, heads: int, kv_heads: int, head_dim: int, r: int = 4, sdpa: bool = False
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.sdpa = heads, kv_heads, head_dim, sdpa
        self.input_layernorm = RMSNorm(hidden)
        self.q_proj = LoraLinear(hidden, heads * head_dim, r)
        self.k_proj = LoraLinear(hidden, kv_heads * head_dim)
        self.v_proj = LoraLinear(hidden, kv_heads * head_dim, r)
        self.o_proj = LoraLinear(heads * head_dim, hidden)
        self.q_norm = RMSNorm(head_dim)
        self.k_norm = RMSNorm(head_dim)
        self.post_attention_layernorm = RMSNorm(hidden)
        inv = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(
        self, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, _ = hidden.shape
        x = self.input_layernorm(hidden)
        q = self.q_norm(self.q_proj(x).view(b, s, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, s, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        freqs = positions.to(torch.float32)[:, None, :, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k = (
            k[:, :, None]
            .expand(b, self.kv_heads, rep, s, self.head_dim)
            .reshape(b, -1, s, self.head_dim)
        )
        v = (
            v[:, :, None]
            .expand(b, self.kv_heads, rep, s, self.head_dim)
            .reshape(b, -1, s, self.head_dim)
        )
        if self.sdpa:
            attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            scores = (q @ k.transpose(-1, -2)) * (self.head_dim**-0.5) + mask
            attn = torch.softmax(scores, dim=-1) @ v  # softmax in the input dtype (bf16)
        out = self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        residual = hidden + out
        return residual, self.post_attention_layernorm(residual)


class HotExperts(nn.Module):
    """The batched padded-bmm hot-experts call: x [E, B, H] -> [E, B, H], weighted."""

    def __init__(self, experts: int, hidden: int, inter: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.gate_up_proj = nn.Parameter(
            torch.randn(experts, 2 * inter, hidden, generator=g) / math.sqrt(hidden),
            requires_grad=False,
        )
        self.down_proj = nn.Parameter(
            torch.randn(experts, hidden, inter, generator=g) / math.sqrt(inter),
            requires_grad=False,
        )

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        gate, up = torch.bmm(x, self.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
        y = torch.bmm(torch.nn.functional.silu(gate) * up, self.down_proj.transpose(1, 2))
        return y * weights


class BadRouting(nn.Module):
    """What must never reach the device: int64 arange, argmax, cumsum, floor_divide."""

    def __init__(self, hidden: int, experts: int) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.randn(experts, hidden) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = x @ self.gate.t()
        top = logits.argmax(dim=-1)  # int64 + denylisted
        pos = torch.arange(x.shape[0]) // 2  # int64 arange + floor_divide
        counts = torch.cumsum(torch.ones_like(logits), dim=0)  # denylisted
        return logits * counts + (top + pos).to(x.dtype)[:, None]


class Int64Only(nn.Module):
    """A graph whose only problem is an int64 tensor op (int64 index input + int64 add)."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.randn(vocab, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # int64 + int64 tensor add at [1, 128]: furiosa-torch 2026.4 fails to compile it
        # (measured; whether int64 ops fail depends on the shape: [2, 5] compiles, [8, 8] fails).
        return torch.nn.functional.embedding(ids + ids, self.embed)


def _mask(b: int, s: int, dtype: torch.dtype) -> torch.Tensor:
    m = torch.full((s, s), -1e4, dtype=torch.float32).triu(1)
    return m.to(dtype)[None, None].expand(b, 1, s, s).contiguous()


def _attention_reference(block: AttentionBlock) -> Callable[..., Any]:
    def ref(hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> Any:
        old = block.sdpa
        block.sdpa = True
        try:
            return block(hidden, positions, mask)
        finally:
            block.sdpa = old

    return ref


def device_graphs(
    widths: str = "tiny",
    seq_len: int = 32,
    buckets: Sequence[int] | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> list[StandInGraph]:
    """Stand-in device graphs: an attention block and a hot-experts call."""
    if widths != "tiny":
        raise ValueError("stand-ins exist at tiny widths only")
    torch.manual_seed(0)
    hidden, heads, kv, hd, experts, inter, b = 64, 4, 2, 16, 4, 32, 1
    attn = AttentionBlock(hidden, heads, kv, hd).to(dtype)
    x = torch.randn(b, seq_len, hidden).to(dtype)
    pos = torch.arange(seq_len, dtype=torch.int32)[None].expand(b, seq_len).contiguous()
    graphs = [
        StandInGraph(
            "attention",
            attn,
            (x, pos, _mask(b, seq_len, dtype)),
            trainable=[0, *(p for n, p in attn.named_parameters() if "lora_" in n)],
            reference=_attention_reference(attn),
        )
    ]
    for bucket in buckets or (16,):
        hot = HotExperts(experts, hidden, inter).to(dtype)
        xe = torch.randn(experts, bucket, hidden).to(dtype)
        w = torch.rand(experts, bucket, 1).to(dtype)
        graphs.append(StandInGraph(f"hot_experts_b{bucket}", hot, (xe, w), trainable=[0, 1]))
    return graphs


def bad_graphs() -> list[StandInGraph]:
    torch.manual_seed(0)
    return [
        StandInGraph("bad_routing", BadRouting(16, 4), (torch.randn(8, 16),)),
        StandInGraph("int64_only", Int64Only(64, 8), (torch.randint(0, 30, (1, 128)),)),
        StandInGraph(
            "sdpa_attention",
            AttentionBlock(32, 2, 1, 16, sdpa=True),
            (
                torch.randn(1, 8, 32),
                torch.arange(8, dtype=torch.int32)[None],
                _mask(1, 8, torch.float32),
            ),
        ),
    ]


def bad_device_graphs(
    widths: str = "tiny",
    seq_len: int = 32,
    buckets: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[StandInGraph]:
    """``bad_graphs`` behind the ``device_graphs`` signature (for ``rngd-check --source``)."""
    return bad_graphs()


class AttentionStock(nn.Module):
    """graphs.py's ``DeviceAttentionBlock`` through the stock ``Qwen3MoeAttention.forward`` with
    transformers' eager attention: what graphs.py's written-out attention replaces (its backward
    has the fp32 ``_softmax_backward_data``)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, h_BSD, moe_BSD, pos_BS, mask_B1SS):
        blk = self.block
        h = h_BSD + moe_BSD
        cos, sin = blk.rope(pos_BS, h.dtype)
        a, _ = blk.self_attn(
            hidden_states=blk.input_layernorm(h),
            position_embeddings=(cos, sin),
            attention_mask=mask_B1SS,
        )
        h_mid = h + a
        return h_mid, blk.post_attention_layernorm(h_mid)


class HeadStock(nn.Module):
    """graphs.py's ``DeviceHead`` with ``torch.logsumexp`` (what ``ops.cross_entropy_int32``
    replaces: ``aten.logsumexp`` does not compile on RNGD)."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, h_BSD, moe_BSD, sel_BNS, labels_BN, w_BN):
        z_BNV = self.head.logits(h_BSD, moe_BSD, sel_BNS)
        vocab = torch.arange(z_BNV.shape[-1], dtype=torch.int32)
        onehot_BNV = (vocab == labels_BN[..., None]).to(z_BNV.dtype)
        ce_BN = torch.logsumexp(z_BNV, dim=-1) - (z_BNV * onehot_BNV).sum(-1)
        return (ce_BN * w_BN.float()).sum()


def graphs_with_stock_ops(
    widths: str = "tiny",
    seq_len: int = 128,
    buckets: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[Any]:
    """graphs.py's attention and head computed the stock way (``attention_stock``: the stock
    attention module with eager attention; ``head_stock``: ``torch.logsumexp``), same weights
    and inputs as ``device_graphs(...)`` (same seed)."""
    import dataclasses

    from npu_lora.rngd.catalogue import device_graphs

    graphs = {g.name: g for g in device_graphs(widths, seq_len, buckets, dtype)}
    attn, head = graphs["attention"], graphs["head"]
    return [
        dataclasses.replace(attn, name="attention_stock", module=AttentionStock(attn.module)),
        dataclasses.replace(head, name="head_stock", module=HeadStock(head.module)),
    ]
