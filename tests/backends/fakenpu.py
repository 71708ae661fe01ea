"""``fakenpu``: a test-only accelerator, the whole of a new backend's code (one module).

``test_fakenpu.py`` copies it into a copy of the tree as ``npu_lora/backends/fakenpu.py`` and
adds its one ``register(...)`` line to ``npu_lora/api/backends.py`` there. The host computes
under another name (a CPU-like device: ``torch.device("cpu")``), so the engine runs on it."""

from __future__ import annotations

from typing import ClassVar

import torch
from npu_lora.backends.base import Backend


class FakeNpuBackend(Backend):
    name = "fakenpu"
    made: ClassVar[list[int]] = []

    def __init__(self, index: int = 0) -> None:
        super().__init__(torch.device("cpu"))
        FakeNpuBackend.made.append(index)

    def _copy_to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)

    def _copy_to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)

    @staticmethod
    def available() -> bool:
        return True
