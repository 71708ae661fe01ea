"""Device backends behind one seam (``Backend``): ``furiosa``, ``cuda``, ``cpu``; ``auto``."""

from __future__ import annotations

from npu_lora.backends.base import Backend
from npu_lora.backends.cpu import CpuBackend
from npu_lora.backends.cuda import CudaBackend

BACKENDS = ("auto", "cpu", "cuda", "furiosa")


def furiosa_available() -> bool:
    from npu_lora.backends.furiosa import FuriosaBackend

    return FuriosaBackend.available()


def _local_rank() -> int:
    """The card of this data-parallel rank: ``LOCAL_RANK`` (torchrun's and our launcher's), else 0."""
    import os

    try:
        return max(0, int(os.environ.get("LOCAL_RANK", "0") or 0))
    except ValueError:
        return 0


def get_backend(name: str = "auto", index: int | None = None) -> Backend:
    """``auto`` picks the first available of furiosa → cuda → cpu. ``index``: the card (default:
    ``LOCAL_RANK``, so each rank of a pod drives its own card; 0 without data parallel)."""
    if index is None:
        index = _local_rank()
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
        return CudaBackend(index)
    if name == "furiosa":
        from npu_lora.backends.furiosa import FuriosaBackend

        return FuriosaBackend(index)
    raise ValueError(f"unknown device backend {name!r}; choose one of {BACKENDS}")


__all__ = ["BACKENDS", "Backend", "CpuBackend", "CudaBackend", "furiosa_available", "get_backend"]
