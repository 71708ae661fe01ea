"""The engine's one seam for strategies the benchmark swaps (:class:`EngineHooks`).

The engine runs one way; the bench measures it against older or alternative ways (variants
``+torch_head``, ``+padmax``, ``+fp32``, ``+4k``: ``npu_lora.api.variant``). Those
alternatives are not flags of the engine: the bench implements this protocol
(``npu_lora.bench.hooks.VariantHooks``) and passes it to ``build_engine(..., hooks=...)``; the
engine consults it at the start of every micro-batch (``HybridEngine.apply_hooks``) and applies
what it returns to the objects it owns. Training, evaluation and inference use
:class:`DefaultHooks`, which returns what the engine would do without any hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from npu_lora.backends import Backend
from npu_lora.moe.stream_linear import head_linear

__all__ = ["DefaultHooks", "EngineHooks", "ExpertWeights", "HeadLinear", "HotPath"]

#: how the frozen LM head computes ``x Wᵀ`` (``DeviceHead(linear=...)``); None: ``lm_head``
HeadLinear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
#: per layer the tensors the experts' ``gate_up_proj`` and ``down_proj`` compute with
ExpertWeights = list[tuple[torch.Tensor, torch.Tensor]]


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
