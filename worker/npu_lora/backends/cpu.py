"""``cpu``: the host stands in for the device (tests, laptops). Calls are still counted."""

from __future__ import annotations

import torch

from npu_lora.backends.base import Backend


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t

    @staticmethod
    def available() -> bool:
        return True
