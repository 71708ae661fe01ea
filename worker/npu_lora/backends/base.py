"""The device seam: every call into the accelerator goes through ``Backend.call``.

What is counted (``Backend.call``):
- one count per call of a device module in the *forward direction*: the embedding, each
  decoder layer's attention block, each layer's batched hot-expert call (also when HostMLP
  re-runs it while recomputing the block forward in backward), and the LM head;
- ``calls_by_name[name]`` counts every call; ``calls_by_layer[layer]`` counts calls made with
  ``layer=<i>`` (the decoder-layer calls: attention block, hot experts).
  ``device_calls_per_layer = sum(calls_by_layer.values()) / num_layers``.

  Per layer and micro-batch this gives: host-only 1 (attention); hot with keep_graph 2
  (attention, hot experts); hot without keep_graph 3 (attention, hot experts, hot experts again
  in the backward recompute).
- NOT counted: backward-direction work (autograd running the backward of device modules:
  it is issued by the autograd engine, not through ``call``), host↔device copies
  (``to_device``/``to_host``), and ``synchronize``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class Backend:
    """Base class; subclasses set ``name`` and ``device`` and may override ``compile``."""

    name: str = "base"

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.calls_by_name: Counter[str] = Counter()
        self.calls_by_layer: Counter[int] = Counter()
        self.call_s = 0.0  # wall seconds spent inside (synchronised) calls

    # --- transfers -------------------------------------------------------------------------
    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Differentiable copy host → device (identity when the device is the host)."""
        return t.to(self.device)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """Differentiable copy device → host (identity when the device is the host)."""
        return t.to("cpu")

    def synchronize(self) -> None:
        """Wait for queued device work (no-op for synchronous backends)."""

    # --- calls -----------------------------------------------------------------------------
    def call(self, name: str, fn: Callable[..., Any], *args: Any, layer: int | None = None) -> Any:
        """Run ``fn(*args)`` on the device, synchronised, and count it (see module doc)."""
        self.calls_by_name[name] += 1
        if layer is not None:
            self.calls_by_layer[layer] += 1
        t0 = time.perf_counter()
        out = fn(*args)
        self.synchronize()
        self.call_s += time.perf_counter() - t0
        return out

    def reset_counts(self) -> None:
        self.calls_by_name.clear()
        self.calls_by_layer.clear()
        self.call_s = 0.0

    def calls_per_layer(self, num_layers: int) -> float:
        return sum(self.calls_by_layer.values()) / max(num_layers, 1)

    # --- compile ---------------------------------------------------------------------------
    def compile(self, module: nn.Module) -> nn.Module | Callable[..., Any]:
        """Compile a device module for this backend (identity by default)."""
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device})"
