"""The bench's strategies for the engine's one seam (:class:`npu_lora.engine.EngineHooks`).

The variants that A/B the engine against an alternative way (``+torch_head``, ``+padmax``,
``+fp32``, ``+4k``, ``+int8``, ``+fp8``; :mod:`npu_lora.api.variant`) are not engine
flags: :class:`VariantHooks` answers the engine's questions for the variant in use
(``VariantRunner.apply`` → :meth:`VariantHooks.use`), and the engine applies the answers to the
objects it owns (``HybridEngine.apply_hooks``).
"""

from __future__ import annotations

from npu_lora.api.variant import Variant
from npu_lora.backends import Backend
from npu_lora.engine.hooks import DefaultHooks, ExpertWeights, HeadLinear, HotPath

__all__ = ["VariantHooks"]


class VariantHooks(DefaultHooks):
    """The engine's own way (``DefaultHooks``) but where the variant in use asks otherwise."""

    def __init__(self) -> None:
        self.variant: Variant | None = None
        self._weights: ExpertWeights | None = None

    def use(self, variant: Variant, weights: ExpertWeights | None = None) -> None:
        """Answer for ``variant`` from now on; ``weights``: the expert tensors it computes with
        (``+fp32``, ``+4k`` copies, ``+int8`` / ``+fp8`` 8-bit copies with their scales; None:
        the engine's own)."""
        self.variant = variant
        self._weights = weights

    def head_linear(self, backend: Backend) -> HeadLinear:
        if self.variant is not None and self.variant.torch_head:
            return None  # the head's own ``lm_head`` (torch's mm)
        return super().head_linear(backend)

    def hot_path(self) -> HotPath:
        v = self.variant
        if v is None:
            return super().hot_path()
        return HotPath(capacity="max" if v.padmax else "cost")

    def expert_weights(self, own: ExpertWeights) -> ExpertWeights | None:
        return self._weights if self._weights is not None else own
