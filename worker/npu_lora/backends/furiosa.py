"""``furiosa``: FuriosaAI RNGD through furiosa-torch (device type ``furiosa``).

The only module of the package that imports furiosa-torch; it does so lazily, so the package
imports without it. Device modules are compiled with
``torch.compile(m, backend=furiosa.torch.backend, dynamic=False)`` (static shapes; the engine
pads hot-expert groups and label positions to buckets so each module compiles a few times only).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from npu_lora.backends.base import Backend


def _furiosa_torch() -> Any | None:
    try:
        return importlib.import_module("furiosa.torch")
    except Exception:  # ImportError, or an ABI mismatch with this torch
        return None


class FuriosaBackend(Backend):
    name = "furiosa"

    def __init__(self, index: int = 0) -> None:
        ft = _furiosa_torch()
        if ft is None:
            raise RuntimeError(
                "device backend 'furiosa' needs furiosa-torch (pip install npu-lora[rngd])"
            )
        self._ft = ft
        super().__init__(torch.device("furiosa", index))

    def synchronize(self) -> None:
        # furiosa-torch 2026.4 has no module-level synchronize; its Stream has one
        # (``current_stream(device).synchronize()``, as in furiosa.torch.ext._execution_pool).
        stream = self._ft.current_stream(self.device)
        stream.synchronize()

    def compile(self, module: nn.Module) -> nn.Module | Callable[..., Any]:
        return torch.compile(module, backend=self._ft.backend, dynamic=False)

    @staticmethod
    def available() -> bool:
        ft = _furiosa_torch()
        if ft is None:
            return False
        try:
            return bool(ft.is_available()) and len(ft.get_available_devices()) > 0
        except Exception:
            return False
