"""Device backends behind one seam (``Backend``): ``furiosa``, ``cuda``, ``cpu``; ``auto``."""

from __future__ import annotations

from npu_lora.backends.base import Backend
from npu_lora.backends.cpu import CpuBackend
from npu_lora.backends.cuda import CudaBackend

BACKENDS = ("auto", "cpu", "cuda", "furiosa")


def furiosa_available() -> bool:
    from npu_lora.backends.furiosa import FuriosaBackend

    return FuriosaBackend.available()


def get_backend(name: str = "auto") -> Backend:
    """``auto`` picks the first available of furiosa → cuda → cpu."""
    if name == "auto":
        if furiosa_available():
            name = "furiosa"
        elif CudaBackend.available():
            name = "cuda"
        else:
            name = "cpu"
    if name == "cpu":
        return CpuBackend()
    if name == "cuda":
        if not CudaBackend.available():
            raise RuntimeError("device backend 'cuda' requested but torch.cuda is not available")
        return CudaBackend()
    if name == "furiosa":
        from npu_lora.backends.furiosa import FuriosaBackend

        return FuriosaBackend()
    raise ValueError(f"unknown device backend {name!r}; choose one of {BACKENDS}")


__all__ = ["BACKENDS", "Backend", "CpuBackend", "CudaBackend", "furiosa_available", "get_backend"]
