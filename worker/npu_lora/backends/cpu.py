"""``cpu``: the host stands in for the device (tests, laptops). Calls and the bytes a device
would move are still counted (``Backend`` traffic). The LM head's streaming kernel on this
backend is chosen one layer up (:func:`npu_lora.moe.stream_linear.head_linear`): ``backends``
sits below ``moe``."""

from __future__ import annotations

import torch

from npu_lora.backends.base import Backend


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self, index: int = 0) -> None:  # one host: the card index does not apply
        super().__init__(torch.device("cpu"))

    def _copy_to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)  # nothing moves; a view keeps the transfer a node of its own

    def _copy_to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)

    @staticmethod
    def available() -> bool:
        return True
