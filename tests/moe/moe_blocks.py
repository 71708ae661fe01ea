"""A small stock Qwen3-MoE block (transformers' ``eager`` experts) for the kernel tests."""

from __future__ import annotations

import torch
from npu_lora.moe import experts as ex
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock


def stock_block(
    dtype: torch.dtype, *, E: int = 16, K: int = 4, H: int = 64, inter: int = 32, seed: int = 0
) -> tuple[Qwen3MoeSparseMoeBlock, Qwen3MoeConfig]:
    """``(block, config)`` with seeded N(0, 0.1) router and expert weights, in ``dtype``."""
    ex.register()
    cfg = Qwen3MoeConfig(
        hidden_size=H,
        moe_intermediate_size=inter,
        num_experts=E,
        num_experts_per_tok=K,
        norm_topk_prob=True,
    )
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    blk = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        blk.experts.gate_up_proj.normal_(std=0.1)
        blk.experts.down_proj.normal_(std=0.1)
        blk.gate.weight.normal_(std=0.1)
    return blk.to(dtype), cfg


def run_block(
    blk: Qwen3MoeSparseMoeBlock, cfg: Qwen3MoeConfig, impl: str, x0: torch.Tensor, gy: torch.Tensor
) -> tuple[torch.Tensor | None, ...]:
    """Forward + backward of ``blk`` with the experts kernel ``impl``: ``(y, dx, d router,
    d gate_up_proj, d down_proj)``."""
    cfg._experts_implementation = impl
    x = x0.clone().requires_grad_(True)
    blk.zero_grad(set_to_none=True)
    y = blk(x)
    y.backward(gy)
    return (
        y.detach(),
        x.grad,
        blk.gate.weight.grad,  # reaches the router only through the routing-weight gradient
        blk.experts.gate_up_proj.grad,
        blk.experts.down_proj.grad,
    )


def small_block() -> Qwen3MoeSparseMoeBlock:
    """A small Qwen3 MoE block (8 experts, top-2) with seeded, non-trivial weights."""
    cfg = Qwen3MoeConfig(
        hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2
    )
    cfg._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    blk = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        blk.experts.gate_up_proj.normal_(std=0.1)
        blk.experts.down_proj.normal_(std=0.1)
        blk.gate.weight.normal_(std=0.1)
    return blk
