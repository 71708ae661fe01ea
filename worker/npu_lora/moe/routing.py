"""The routing bookkeeping the host experts kernels share (``npu_lora_sorted``,
:mod:`npu_lora.moe.experts`; ``npu_lora_stream``, :mod:`npu_lora.moe.stream`): the (token, slot)
pairs in expert order, and the module layout check. Its own module so that ``stream`` need not
import ``experts`` (which registers ``stream``'s kernel too)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Routing:
    """Integer bookkeeping of one call: the (token, slot) pairs in expert order."""

    perm: torch.Tensor  # [S] int64: sorted position -> flat (token*K + slot) index
    inv_perm: torch.Tensor  # [S] int64: flat index -> sorted position
    token_idx: torch.Tensor  # [S] int64: sorted position -> token
    offsets: torch.Tensor  # [E] int32: cumulative group ends (for _grouped_mm)
    counts: list[int]  # [E] group sizes (host ints, one sync)
    valid: int  # rows < valid belong to a real expert (ids >= E are sorted to the tail)
    num_tokens: int
    top_k: int

    @property
    def hit_experts(self) -> list[int]:
        return [e for e, n in enumerate(self.counts) if n]


def build_routing(top_k_index: torch.Tensor, num_experts: int) -> Routing:
    """Stable sort of the flattened expert ids; deterministic, integer-only."""
    with torch.no_grad():
        num_tokens, top_k = top_k_index.shape
        ids = top_k_index.reshape(-1).to(torch.int64)
        _, perm = torch.sort(ids, stable=True)
        inv_perm = torch.empty_like(perm)
        inv_perm[perm] = torch.arange(perm.numel(), device=perm.device)
        token_idx = torch.div(perm, top_k, rounding_mode="floor")
        counts_t = torch.bincount(ids.clamp(max=num_experts), minlength=num_experts + 1)
        counts = counts_t[:num_experts].tolist()
        offsets = torch.cumsum(counts_t[:num_experts], 0, dtype=torch.int32)
        valid = int(sum(counts))
    return Routing(perm, inv_perm, token_idx, offsets, counts, valid, num_tokens, top_k)


def check_module(module: torch.nn.Module, name: str) -> None:
    """Raise NotImplementedError (naming kernel ``name``) unless ``module`` has the Qwen3-MoE
    experts layout the kernels compute."""
    if getattr(module, "has_bias", False) or not getattr(module, "has_gate", True):
        raise NotImplementedError(f"{name}: only gated experts without bias (Qwen3-MoE layout)")
    if getattr(module, "is_transposed", False) or not getattr(module, "is_concatenated", True):
        raise NotImplementedError(f"{name}: needs [E, 2I, H] concatenated gate/up weights")
    if getattr(module, "has_post_expert_norm", False):
        raise NotImplementedError(f"{name}: post-expert norm is not supported")
    act = getattr(module, "act_fn", None)
    if (
        act is not None
        and not isinstance(act, torch.nn.SiLU)
        and type(act).__name__
        not in (
            "SiLUActivation",
            "SiLU",
        )
    ):
        raise NotImplementedError(f"{name}: only SiLU experts (got {type(act).__name__})")
