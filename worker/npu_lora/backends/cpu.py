"""``cpu``: the host stands in for the device (tests, laptops). Calls and the bytes a device
would move are still counted (``Backend`` traffic)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from npu_lora.backends.base import Backend


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))

    def _copy_to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)  # nothing moves; a view keeps the transfer a node of its own

    def _copy_to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)

    def frozen_linear(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """The streaming kernel (``npu_lora.moe.stream_linear``): the head's weight read once per
        direction at close to memory bandwidth; ``F.linear`` where it does not apply."""
        from npu_lora.moe.stream_linear import frozen_linear

        return frozen_linear

    @staticmethod
    def available() -> bool:
        return True
