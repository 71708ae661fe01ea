"""The host expert weight bytes a rank's experts kernels read: the ``expert_bytes`` column.

Counted, not assumed: a forward hook on each layer's ``experts`` module (the host kernel,
whichever is registered: ``npu_lora_stream``, ``grouped_mm``, ...) adds, for every call, the
bytes of the experts hit by at least one of the call's tokens
(:func:`npu_lora.moe.experts.hit_expert_bytes`: hit experts × one expert's gate/up + down bytes
in the host dtype). When the call's output takes part in a backward, a hook on that output adds
the same bytes once more when its gradient arrives: the backward reads each hit expert's
weights once more (``dx = dy·W``). So per layer and micro-batch:

- ``keepGraph`` on: forward + backward = 2 × hit bytes;
- ``keepGraph`` off: forward (no grad) + recompute + backward = 3 × hit bytes;
- evaluation (no grad): 1 × hit bytes.

With hot experts only the cold (host) experts pass through ``experts``; the hot ones run on the
device and are not counted. A call that hits an expert for one token and one for a hundred
counts both alike: each is streamed whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from npu_lora.moe.experts import hit_expert_bytes

__all__ = ["ExpertReads"]


class ExpertReads:
    """Counts the host expert weight bytes read through ``experts_modules`` (see the module
    docstring); :attr:`bytes` since the last :meth:`reset`."""

    def __init__(self, experts_modules: Sequence[nn.Module]) -> None:
        self.bytes = 0
        self._handles = [m.register_forward_hook(self._on_forward) for m in experts_modules]

    def reset(self) -> None:
        self.bytes = 0

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _on_forward(self, module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        top_k_index = args[1]
        n = hit_expert_bytes(top_k_index, module.gate_up_proj, module.down_proj)
        self.bytes += n
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda _grad_TD: self._add(n))

    def _add(self, n: int) -> None:
        self.bytes += n
