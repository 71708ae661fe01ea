"""The RNGD compile check's catalogue: the engine's device graphs with example inputs.

``device_graphs`` builds every device module of :mod:`npu_lora.device.graphs` at ``tiny`` or
real Qwen3-30B-A3B widths (one layer, random weights, fixed seed), with example inputs built
exactly as the engine builds them and the stock transformers computation as the reference. It is
the default ``--source`` of ``npu-lora rngd-check`` and the subject of the device-graph tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from npu_lora.device.graphs import (
    DeviceAttentionBlock,
    DeviceEmbed,
    DeviceHead,
    HotExpertsBatched,
    causal_mask,
    label_gather,
    positions,
)

__all__ = ["DeviceGraph", "config_from_widths", "device_graphs", "hot_reference", "plan_graphs"]


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
class _Build:
    """What every graph of one ``device_graphs`` call shares (the RNG is consumed in order)."""

    cfg: Any
    gen: torch.Generator
    B: int
    S: int
    dtype: torch.dtype

    @property
    def std(self) -> float:
        return self.cfg.initializer_range


def _embed_graph(b: _Build) -> DeviceGraph:
    embed = nn.Embedding(b.cfg.vocab_size, b.cfg.hidden_size).to(b.dtype)
    _init_(embed, b.std)
    ids = torch.randint(0, b.cfg.vocab_size, (b.B, b.S), generator=b.gen)
    return DeviceGraph(
        "embed", DeviceEmbed(embed), (ids.to(torch.int32),), (), lambda ids_BS: embed(ids_BS.long())
    )


def _attention_graph(
    b: _Build,
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


def _head_graph(
    b: _Build, h: torch.Tensor, moe: torch.Tensor, n_bucket: int | None = None, name: str = "head"
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


def _hot_graphs(
    b: _Build, buckets: tuple[int, ...], hot_fraction: float, eh: int | None = None
) -> list[DeviceGraph]:
    """One ``hot_experts_b<Bk>`` per bucket; each group filled to a random length."""
    D, E, inter = b.cfg.hidden_size, b.cfg.num_experts, b.cfg.moe_intermediate_size
    Eh = max(1, math.ceil(hot_fraction * E - 1e-9)) if eh is None else eh
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
    b = _Build(_graph_config(widths), torch.manual_seed(seed), batch, seq_len, dtype)
    embed = _embed_graph(b)
    attention = _attention_graph(b, lora_r)
    h, moe = attention.example_inputs[:2]
    head = _head_graph(b, h, moe)
    return [embed, attention, head, *_hot_graphs(b, buckets or (seq_len,), hot_fraction)]


# ---------------------------------------------------------------------------------------------
# the compile plan's graphs (npu_lora.compile.plan): one list of device graphs in the project


def config_from_widths(w: dict[str, Any]) -> Any:
    """A one-layer ``Qwen3MoeConfig`` at a plan's widths (``Plan.model``), eager attention."""
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(
        hidden_size=w["hidden_size"],
        vocab_size=w["vocab_size"],
        num_attention_heads=w["num_attention_heads"],
        num_key_value_heads=w["num_key_value_heads"],
        head_dim=w["head_dim"],
        attention_bias=w["attention_bias"],
        rms_norm_eps=w["rms_norm_eps"],
        rope_theta=w["rope_theta"],
        num_experts=w["num_experts"],
        num_experts_per_tok=w["num_experts_per_tok"],
        moe_intermediate_size=w["moe_intermediate_size"],
        num_hidden_layers=1,
        max_window_layers=1,
        tie_word_embeddings=False,
        output_router_logits=False,
    )
    cfg._attn_implementation = "eager"
    return cfg


def _gathered_graph(b: _Build, hot: DeviceGraph, T: int) -> DeviceGraph:
    """``HotExpertsGathered`` around a ``hot_experts_b<Bk>`` graph's module: T token rows, an
    int32 row index per (slot, position), routing weights (0 on padding)."""
    from npu_lora.device.graphs import HotExpertsGathered

    _x_EhBD, r_EhB = hot.example_inputs
    Eh, Bk = r_EhB.shape
    x_TD = torch.randn(T, b.cfg.hidden_size, generator=b.gen).to(b.dtype)
    idx = torch.randint(0, T, (Eh, Bk), generator=b.gen, dtype=torch.int64).to(torch.int32)
    return DeviceGraph(
        f"hot_gathered_b{Bk}", HotExpertsGathered(hot.module), (x_TD, idx, r_EhB), (0, 2), None
    )


def plan_graphs(plan: Any, names: list[str] | None = None, *, seed: int = 0) -> list[DeviceGraph]:
    """The :class:`DeviceGraph` of every entry of a compile plan (``names``: only these), built
    at the plan's widths, shapes, dtype and LoRA settings (one layer, random weights, fixed
    seed): what ``npu-lora precompile`` compiles and ``npu-lora rngd-check --plan`` checks."""
    cfg = config_from_widths(plan.model)
    run = plan.run
    dtype = getattr(torch, run["device_dtype"])
    b = _Build(cfg, torch.manual_seed(seed), run["batch_size"], run["seq_len"], dtype)
    want = set(names) if names else None
    out: list[DeviceGraph] = []
    attention: DeviceGraph | None = None

    def attn() -> DeviceGraph:
        nonlocal attention
        if attention is None:
            att = next(x for x in plan.entries if x.graph == "DeviceAttentionBlock")
            lora = att.params["lora"]
            attention = _attention_graph(
                b,
                int(lora["r"]),
                targets=tuple(lora["target_modules"]),
                alpha=lora["alpha"],
                dropout=float(lora["dropout"]),
            )
        return attention

    for e in plan.entries:
        if want is not None and e.name not in want:
            continue  # built only when asked for (the embed and head hold V x D weights)
        if e.graph == "DeviceEmbed":
            g = _embed_graph(b)
        elif e.graph == "DeviceAttentionBlock":
            g = attn()
        elif e.graph == "DeviceHead":
            if e.params.get("lora_head"):
                raise NotImplementedError("LoRA on lm_head: the head graph is not in the catalogue")
            h, moe = attn().example_inputs[:2]
            n = int(e.inputs[2]["shape"][1])
            g = _head_graph(b, h, moe, n_bucket=n, name=e.name)
        elif e.graph == "HotExpertsBatched":
            bk = int(e.inputs[0]["shape"][1])
            eh = int(e.inputs[0]["shape"][0])
            g = _hot_graphs(b, (bk,), 1.0, eh=eh)[0]
        elif e.graph == "HotExpertsGathered":
            eh, bk = (int(v) for v in e.inputs[1]["shape"])
            hot = _hot_graphs(b, (bk,), 1.0, eh=eh)[0]
            g = _gathered_graph(b, hot, int(e.inputs[0]["shape"][0]))
        else:
            raise ValueError(f"plan entry {e.name}: unknown graph {e.graph!r}")
        g.name = e.name
        g.plan_key = e.key
        out.append(g)
    return out
