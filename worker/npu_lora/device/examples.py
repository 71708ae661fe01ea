"""The engine's device graphs with example inputs (:class:`DeviceGraph`), built at any widths.

One set of builders for the two lists of device graphs in the project: the compile plan's
(:func:`npu_lora.compile.graphs.plan_graphs`, what ``npu-lora precompile`` compiles) and the RNGD
check's catalogue (:func:`npu_lora.rngd.catalogue.device_graphs`, tiny or real widths). Each
builder makes one module of :mod:`npu_lora.device.graphs` with random weights (the
:class:`GraphBuild`'s generator, consumed in order) and inputs built exactly as the engine builds
them, and the stock transformers computation as the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from npu_lora.api.sizing import hot_count
from npu_lora.device.graphs import (
    DeviceAttentionBlock,
    DeviceEmbed,
    DeviceHead,
    HotExpertsBatched,
    HotExpertsGathered,
    causal_mask,
    label_gather,
    positions,
)

__all__ = [
    "DeviceGraph",
    "GraphBuild",
    "attention_graph",
    "embed_graph",
    "gathered_graph",
    "head_graph",
    "hot_graphs",
    "hot_reference",
]


@dataclass
class DeviceGraph:
    """One device module with example inputs, for compile checks (RNGD) and numeric tests."""

    name: str
    module: nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    grad_inputs: tuple[int, ...]
    reference: Callable[..., object] | None
    #: the graph's content key in the compile plan (``plan_graphs``; None for ``device_graphs``)
    plan_key: str | None = None


def _init_(module: nn.Module, std: float) -> None:
    for name, p in module.named_parameters():
        with torch.no_grad():
            if "norm" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, std)


class _AttnParts(nn.Module):
    def __init__(self, cfg: Any) -> None:
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


@dataclass
class GraphBuild:
    """What every graph of one list shares (the RNG is consumed in order)."""

    cfg: Any
    gen: torch.Generator
    B: int
    S: int
    dtype: torch.dtype

    @property
    def std(self) -> float:
        return self.cfg.initializer_range


def embed_graph(b: GraphBuild) -> DeviceGraph:
    embed = nn.Embedding(b.cfg.vocab_size, b.cfg.hidden_size).to(b.dtype)
    _init_(embed, b.std)
    ids = torch.randint(0, b.cfg.vocab_size, (b.B, b.S), generator=b.gen)
    return DeviceGraph(
        "embed", DeviceEmbed(embed), (ids.to(torch.int32),), (), lambda ids_BS: embed(ids_BS.long())
    )


def attention_graph(
    b: GraphBuild,
    lora_r: int,
    *,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    alpha: float | None = None,
    dropout: float = 0.0,
) -> DeviceGraph:
    """The attention block with LoRA r=``lora_r`` on ``targets`` (default q_proj, v_proj; peft),
    non-zero LoRA B."""
    from peft import LoraConfig, inject_adapter_in_model
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRotaryEmbedding

    parts = _AttnParts(b.cfg)
    _init_(parts, b.std)
    attn_targets = [t for t in targets if t in ("q_proj", "k_proj", "v_proj", "o_proj")]
    parts = inject_adapter_in_model(
        LoraConfig(
            r=lora_r,
            lora_alpha=2 * lora_r if alpha is None else alpha,
            lora_dropout=dropout,
            target_modules=attn_targets or ["q_proj", "v_proj"],
        ),
        parts,
    )
    for n, p in parts.named_parameters():  # non-zero LoRA B so the adapter path is exercised
        if "lora_B" in n:
            with torch.no_grad():
                p.normal_(0.0, b.std)
    parts.to(b.dtype)
    rotary = Qwen3MoeRotaryEmbedding(b.cfg)
    attn = DeviceAttentionBlock(
        parts.input_layernorm, parts.self_attn, parts.post_attention_layernorm, rotary
    )
    D = b.cfg.hidden_size
    h = torch.randn(b.B, b.S, D, generator=b.gen, dtype=torch.float32).to(b.dtype)
    moe = (0.1 * torch.randn(b.B, b.S, D, generator=b.gen)).to(b.dtype)
    am = torch.ones(b.B, b.S, dtype=torch.long)
    mask = causal_mask(am, b.B, b.S, b.dtype)

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

    return DeviceGraph("attention", attn, (h, moe, positions(b.B, b.S), mask), (0, 1), attn_ref)


def head_graph(
    b: GraphBuild,
    h: torch.Tensor,
    moe: torch.Tensor,
    n_bucket: int | None = None,
    name: str = "head",
) -> DeviceGraph:
    """Final norm + LM head (frozen, as peft leaves them) + CE at a label bucket ``n_bucket``
    (default N = S/4)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm

    D, V, B, S = b.cfg.hidden_size, b.cfg.vocab_size, b.B, b.S
    norm = Qwen3MoeRMSNorm(D, eps=b.cfg.rms_norm_eps).to(b.dtype)
    lm_head = nn.Linear(D, V, bias=False).to(b.dtype)
    _init_(norm, b.std)
    _init_(lm_head, b.std)
    norm.requires_grad_(False)  # frozen base weights, as in the engine (peft freezes them)
    lm_head.requires_grad_(False)
    head = DeviceHead(norm, lm_head, V)
    labels = torch.full((B, S), -100, dtype=torch.long)
    n = max(S // 4, 1) if n_bucket is None else n_bucket
    n_ans = max(min(n, S - 1), 1)
    labels[:, S - n_ans :] = torch.randint(0, V, (B, n_ans), generator=b.gen)
    lg = label_gather(labels, b.dtype, n_bucket=n)

    def head_ref(h_BSD, moe_BSD, sel_BNS, labels_BN, w_BN):
        z = lm_head(norm(h_BSD + moe_BSD)).float()  # full-sequence logits (the stock way)
        return F.cross_entropy(
            z[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100
        )

    inputs = (h.detach().clone(), moe.detach().clone(), lg.sel_BNS, lg.labels_BN, lg.w_BN)
    return DeviceGraph(name, head, inputs, (0, 1), head_ref)


def hot_graphs(
    b: GraphBuild, buckets: tuple[int, ...], hot_fraction: float, eh: int | None = None
) -> list[DeviceGraph]:
    """One ``hot_experts_b<Bk>`` per bucket; each group filled to a random length."""
    D, E, inter = b.cfg.hidden_size, b.cfg.num_experts, b.cfg.moe_intermediate_size
    Eh = hot_count(hot_fraction, E) if eh is None else eh
    w_gu = (b.std * torch.randn(Eh, 2 * inter, D, generator=b.gen)).to(b.dtype)
    w_dn = (b.std * torch.randn(Eh, D, inter, generator=b.gen)).to(b.dtype)
    hot = HotExpertsBatched(w_gu, w_dn)
    graphs = []
    for bk in buckets:
        x = torch.randn(Eh, bk, D, generator=b.gen).to(b.dtype)
        r = torch.rand(Eh, bk, generator=b.gen).to(b.dtype)
        fill = torch.arange(bk)[None] < torch.randint(1, bk + 1, (Eh, 1), generator=b.gen)
        x = torch.where(fill[..., None], x, x[:1, :1])  # padding repeats a real row (token 0)
        r = r * fill  # ... with routing weight 0, as the engine builds them
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


def gathered_graph(b: GraphBuild, hot: DeviceGraph, T: int) -> DeviceGraph:
    """``HotExpertsGathered`` around a ``hot_experts_b<Bk>`` graph's module: T token rows, an
    int32 row index per (slot, position), routing weights (0 on padding)."""
    _x_EhBD, r_EhB = hot.example_inputs
    Eh, Bk = r_EhB.shape
    x_TD = torch.randn(T, b.cfg.hidden_size, generator=b.gen).to(b.dtype)
    idx = torch.randint(0, T, (Eh, Bk), generator=b.gen, dtype=torch.int64).to(torch.int32)
    return DeviceGraph(
        f"hot_gathered_b{Bk}", HotExpertsGathered(hot.module), (x_TD, idx, r_EhB), (0, 2), None
    )
