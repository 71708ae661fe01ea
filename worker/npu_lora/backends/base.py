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
- NOT counted as calls: backward-direction work (autograd running the backward of device
  modules: it is issued by the autograd engine, not through ``call``), host↔device copies
  (``to_device``/``to_host``), and ``synchronize``.

Traffic (``Backend.to_device`` / ``to_host``, the one place copies happen): every copy across
the seam adds its bytes (``numel · element_size`` of what crosses, in the dtype it crosses in)
to ``to_device_bytes`` / ``to_host_bytes`` and its wall time (the copy, then ``synchronize``) to ``to_device_s``
/ ``to_host_s``, keyed by ``layer`` (``None``: outside the decoder layers: inputs, head, ...).
The copies are differentiable (``_Transfer``): the backward of a host→device copy is a
device→host copy of the gradient, counted the same way in the other direction under the same
layer. The ``cpu`` backend moves nothing (the host stands in for the device) but counts what a
device would move, so the accounting is the same arithmetic on every backend (tested).
Subclasses implement the raw copies (``_copy_to_device``, ``_copy_to_host``); ``stage=`` names
a reused host staging buffer (pinned where ``pin_staging``) that a host→device copy goes
through: no per-step allocation for the recurring hot-expert inputs (``staging_allocs`` counts
the buffers made).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class Traffic:
    """Bytes and copy seconds across the seam, per direction, keyed by layer (None: other)."""

    to_device_bytes: Counter = field(default_factory=Counter)
    to_host_bytes: Counter = field(default_factory=Counter)
    to_device_s: Counter = field(default_factory=Counter)
    to_host_s: Counter = field(default_factory=Counter)

    def add(self, to_device: bool, layer: int | None, nbytes: int, seconds: float) -> None:
        if to_device:
            self.to_device_bytes[layer] += nbytes
            self.to_device_s[layer] += seconds
        else:
            self.to_host_bytes[layer] += nbytes
            self.to_host_s[layer] += seconds

    def merge(self, other: Traffic) -> None:
        for mine, theirs in (
            (self.to_device_bytes, other.to_device_bytes),
            (self.to_host_bytes, other.to_host_bytes),
            (self.to_device_s, other.to_device_s),
            (self.to_host_s, other.to_host_s),
        ):
            mine.update(theirs)

    def clear(self) -> None:
        for c in (self.to_device_bytes, self.to_host_bytes, self.to_device_s, self.to_host_s):
            c.clear()

    def totals(self) -> dict[str, float]:
        return {
            "to_device_bytes": int(sum(self.to_device_bytes.values())),
            "to_host_bytes": int(sum(self.to_host_bytes.values())),
            "to_device_s": float(sum(self.to_device_s.values())),
            "to_host_s": float(sum(self.to_host_s.values())),
        }

    def by_layer(self, num_layers: int) -> dict[str, list]:
        """Per decoder layer (index 0..L-1); traffic outside the layers is only in the totals."""
        return {
            "to_device_bytes": [int(self.to_device_bytes.get(i, 0)) for i in range(num_layers)],
            "to_host_bytes": [int(self.to_host_bytes.get(i, 0)) for i in range(num_layers)],
            "to_device_s": [float(self.to_device_s.get(i, 0.0)) for i in range(num_layers)],
            "to_host_s": [float(self.to_host_s.get(i, 0.0)) for i in range(num_layers)],
        }


class _Transfer(torch.autograd.Function):
    """A counted copy across the seam whose backward is the counted copy back."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        t: torch.Tensor,
        backend: Backend,
        to_device: bool,
        layer: int | None,
        dtype: torch.dtype | None,
        stage: str | None,
    ) -> torch.Tensor:
        ctx.backend, ctx.to_device, ctx.layer = backend, to_device, layer
        ctx.src = (t.device, t.dtype)
        return backend._transfer(t, to_device, layer, dtype, stage)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        be: Backend = ctx.backend
        _device, dtype = ctx.src
        # the gradient goes back the way the value came, counted in the other direction
        back = be._transfer(g, not ctx.to_device, ctx.layer, None, None)
        return back.to(dtype), None, None, None, None, None


class Backend:
    """Base class; subclasses set ``name`` and ``device`` and may override ``compile`` and the
    raw copies ``_copy_to_device`` / ``_copy_to_host``. A subclass is registered by name in
    :mod:`npu_lora.api.backends` (its ``implementation``)."""

    name: str = "base"
    #: staging buffers are pinned (page-locked) host memory (cuda)
    pin_staging: bool = False

    @staticmethod
    def available() -> bool:
        """Whether this backend can run on this machine."""
        return True

    @property
    def device_gather(self) -> bool:
        """Hot rows may be gathered on the device (``HotLayer.device_gather``): the registry's
        ``device_gather`` of this backend's name (True for an unregistered name)."""
        from npu_lora.api import backends as registry

        return registry.entry(self.name).device_gather if self.name in registry.names() else True

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.calls_by_name: Counter[str] = Counter()
        self.calls_by_layer: Counter[int] = Counter()
        self.call_s = 0.0  # wall seconds spent inside (synchronised) calls
        self.traffic = Traffic()
        self._staging: dict[str, torch.Tensor] = {}
        self.staging_allocs = 0  # staging buffers allocated (grows only with a larger shape)

    # --- transfers -------------------------------------------------------------------------
    def to_device(
        self,
        t: torch.Tensor,
        *,
        layer: int | None = None,
        dtype: torch.dtype | None = None,
        stage: str | None = None,
    ) -> torch.Tensor:
        """Differentiable, counted copy host → device, cast to ``dtype`` on the way (one pass:
        the cast writes the staging buffer ``stage`` when the backend stages copies)."""
        return self._move(t, True, layer, dtype, stage)

    def to_host(self, t: torch.Tensor, *, layer: int | None = None) -> torch.Tensor:
        """Differentiable, counted copy device → host."""
        return self._move(t, False, layer, None, None)

    def _move(
        self,
        t: torch.Tensor,
        to_device: bool,
        layer: int | None,
        dtype: torch.dtype | None,
        stage: str | None,
    ) -> torch.Tensor:
        if torch.is_grad_enabled() and t.requires_grad:
            return _Transfer.apply(t, self, to_device, layer, dtype, stage)
        return self._transfer(t, to_device, layer, dtype, stage)

    def _transfer(
        self,
        t: torch.Tensor,
        to_device: bool,
        layer: int | None,
        dtype: torch.dtype | None,
        stage: str | None,
    ) -> torch.Tensor:
        t0 = time.perf_counter()
        if to_device:
            if dtype is not None and dtype != t.dtype and stage is None:
                t = t.to(dtype)
            if stage is not None and self.device.type != "cpu":
                buf = self.staging(stage, t.shape, dtype or t.dtype)
                buf.copy_(t)  # the cast (if any) and the gather's result land here in one pass
                t = buf
            elif dtype is not None and dtype != t.dtype:
                t = t.to(dtype)
            out = self._copy_to_device(t)
        else:
            out = self._copy_to_host(t)
        self.synchronize()
        nbytes = (out.numel() * out.element_size()) if to_device else t.numel() * t.element_size()
        self.traffic.add(to_device, layer, nbytes, time.perf_counter() - t0)
        return out

    def staging(self, key: str, shape: torch.Size | tuple[int, ...], dtype: torch.dtype):
        """A reused host buffer ``key`` viewed as ``shape``/``dtype`` (grown, never shrunk)."""
        n = 1
        for d in shape:
            n *= int(d)
        nbytes = n * dtype.itemsize
        buf = self._staging.get(key)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=self.pin_staging)
            self._staging[key] = buf
            self.staging_allocs += 1
        return buf[:nbytes].view(dtype).view(shape)

    def _copy_to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device)

    def _copy_to_host(self, t: torch.Tensor) -> torch.Tensor:
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
        self.traffic.clear()

    def calls_per_layer(self, num_layers: int) -> float:
        return sum(self.calls_by_layer.values()) / max(num_layers, 1)

    # --- compile ---------------------------------------------------------------------------
    def compile(self, module: nn.Module) -> nn.Module | Callable[..., Any]:
        """Compile a device module for this backend (identity by default)."""
        return module

    def frozen_linear(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """``F.linear(x, W)`` for a frozen ``W`` and a few rows, as this backend does it best
        (the LM head at the label positions); ``None``: the module's own forward."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device})"
