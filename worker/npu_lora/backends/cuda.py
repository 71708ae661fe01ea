"""``cuda``: an NVIDIA GPU as the device (eager by default, ``torch.compile`` optional)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from npu_lora.backends.base import Backend


class CudaBackend(Backend):
    name = "cuda"
    pin_staging = True

    def __init__(self, index: int = 0, *, use_compile: bool = False) -> None:
        if not self.available():
            raise RuntimeError("device backend 'cuda' requested but torch.cuda is not available")
        super().__init__(torch.device("cuda", index))
        self.use_compile = use_compile

    def _copy_to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def compile(self, module: nn.Module) -> nn.Module | Callable[..., Any]:
        return torch.compile(module, dynamic=False) if self.use_compile else module

    @staticmethod
    def available() -> bool:
        return torch.cuda.is_available()
