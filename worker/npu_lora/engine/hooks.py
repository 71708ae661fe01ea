"""The engine's one seam for strategies the benchmark swaps (:class:`EngineHooks`).

The engine runs one way; the bench measures it against older or alternative ways (variants
``+torch_head``, ``+padmax``, ``+fp32``, ``+4k``, ``+int8``, ``+fp8``:
``npu_lora.api.variant``). Those
alternatives are not flags of the engine: the bench implements this protocol
(``npu_lora.bench.hooks.VariantHooks``) and passes it to ``build_engine(..., hooks=...)``; the
engine consults it at the start of every micro-batch (``HybridEngine.apply_hooks``) and applies
what it returns to the objects it owns. Training, evaluation and inference use
:class:`DefaultHooks`, which returns what the engine would do without any hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import nn

from npu_lora.backends import Backend
from npu_lora.moe.stream_linear import head_linear

__all__ = [
    "DefaultHooks",
    "EngineHooks",
    "ExpertTensor",
    "ExpertWeights",
    "HeadLinear",
    "HotPath",
    "Q8Weight",
    "experts_tensors",
    "set_experts_tensors",
]

#: how the frozen LM head computes ``x Wᵀ`` (``DeviceHead(linear=...)``); None: ``lm_head``
HeadLinear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None


class Q8Weight(NamedTuple):
    """One 8-bit expert weight as the experts module holds it (:mod:`npu_lora.models.quant`):
    the bytes ``q`` (``int8`` / ``float8_e4m3fn``, ``[E, R, C]``), its fp32 ``scale`` and the
    scale ``block`` ``(BR, BC)``."""

    q: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]

    def data_ptr(self) -> int:
        return self.q.data_ptr()


#: one expert weight: a plain tensor, or 8-bit bytes with their scales
ExpertTensor = torch.Tensor | Q8Weight
#: per layer the tensors the experts' ``gate_up_proj`` and ``down_proj`` compute with
ExpertWeights = list[tuple[ExpertTensor, ExpertTensor]]
_NAMES = ("gate_up_proj", "down_proj")


def experts_tensors(experts: nn.Module) -> tuple[ExpertTensor, ExpertTensor]:
    """``(gate_up_proj, down_proj)`` of an experts module as it computes now: the tensors' data,
    or :class:`Q8Weight` when the module holds 8-bit experts (``*_scale`` buffers)."""
    out = []
    for name in _NAMES:
        data = getattr(experts, name).data
        scale = experts._buffers.get(f"{name}_scale")
        if data.dtype in (torch.int8, torch.float8_e4m3fn) and scale is not None:
            out.append(Q8Weight(data, scale, tuple(getattr(experts, "quant_block", (1, 0)))))
        else:
            out.append(data)
    return out[0], out[1]


def set_experts_tensors(experts: nn.Module, pair: tuple[ExpertTensor, ExpertTensor]) -> None:
    """Point an experts module at ``pair`` in place (the parameters' ``.data``, no copy): a
    :class:`Q8Weight` also sets its ``*_scale`` buffer and ``quant_block`` (the stream kernel
    picks its 8-bit path from the dtype); a plain tensor on an 8-bit module drops them, so the
    module is as it was before the 8-bit weights came."""
    for name, t in zip(_NAMES, pair, strict=True):
        p = getattr(experts, name)
        if isinstance(t, Q8Weight):
            p.data = t.q
            experts._buffers[f"{name}_scale"] = t.scale
            experts.quant_block = tuple(t.block)
        else:
            p.data = t
            experts._buffers.pop(f"{name}_scale", None)
    if not any(isinstance(t, Q8Weight) for t in pair):
        experts.__dict__.pop("quant_block", None)


@dataclass(frozen=True)
class HotPath:
    """How the hot layers run: ``capacity`` ``cost`` (padded rows vs host overflow, the
    engine's rule) or ``max`` (pad to the largest group)."""

    capacity: str = "cost"


class EngineHooks(Protocol):
    """What the engine asks its strategy object before every micro-batch."""

    def first_moe_input(
        self, backend: Backend, shape_BSD: tuple[int, int, int], dtype: torch.dtype
    ) -> torch.Tensor:
        """The first decoder layer's "MoE output" (zeros) on the device."""
        ...

    def head_linear(self, backend: Backend) -> HeadLinear:
        """The LM head's ``x Wᵀ`` on ``backend`` (eager backends; see ``DeviceHead``)."""
        ...

    def hot_path(self) -> HotPath:
        """How the hot layers run."""
        ...

    def expert_weights(self, own: ExpertWeights) -> ExpertWeights | None:
        """The expert tensors to compute with, given the engine's own (``own``: as they were
        when the hooks were installed); None: leave them as they are."""
        ...


class DefaultHooks:
    """The engine's own way: zeros made on the device, the backend's head kernel
    (``moe.stream_linear.head_linear``), the cost rule and the current hot path, the expert
    weights left where they are."""

    def first_moe_input(
        self, backend: Backend, shape_BSD: tuple[int, int, int], dtype: torch.dtype
    ) -> torch.Tensor:
        return torch.zeros(*shape_BSD, dtype=dtype, device=backend.device)  # nothing copied

    def head_linear(self, backend: Backend) -> HeadLinear:
        return head_linear(backend)

    def hot_path(self) -> HotPath:
        return HotPath()

    def expert_weights(self, own: ExpertWeights) -> ExpertWeights | None:
        return None
