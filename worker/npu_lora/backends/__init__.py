"""Device backends behind one seam (``Backend``), keyed by the names of the one registry
(:mod:`npu_lora.api.backends`: ``furiosa``, ``cuda``, ``cpu``; ``auto``). A backend's module is
imported when it is asked for (``backend_class``), so furiosa-torch is never imported here."""

from __future__ import annotations

import importlib

from npu_lora.api import backends as registry
from npu_lora.backends.base import Backend
from npu_lora.backends.cpu import CpuBackend
from npu_lora.backends.cuda import CudaBackend

#: ``auto`` and the registered backends (sorted)
BACKENDS = registry.choices()


def backend_class(name: str) -> type[Backend]:
    """The implementation registered as ``name`` (ValueError for an unknown name)."""
    module, _, cls = registry.entry(name).implementation.partition(":")
    found = getattr(importlib.import_module(module), cls)
    if not (isinstance(found, type) and issubclass(found, Backend)):
        raise TypeError(f"backend {name!r}: {module}:{cls} is not a Backend")
    return found


def backend_available(name: str) -> bool:
    """Whether backend ``name`` can run on this machine (its ``available()``)."""
    return bool(backend_class(name).available())


def furiosa_available() -> bool:
    return backend_available("furiosa")


def _local_rank() -> int:
    """The card of this data-parallel rank: ``LOCAL_RANK`` (torchrun's and our launcher's), else 0."""
    import os

    try:
        return max(0, int(os.environ.get("LOCAL_RANK", "0") or 0))
    except ValueError:
        return 0


def get_backend(name: str = "auto", index: int | None = None) -> Backend:
    """``auto`` picks the first available in the registry's order (furiosa → cuda → cpu).
    ``index``: the card (default: ``LOCAL_RANK``, so each rank of a pod drives its own card; 0
    without data parallel)."""
    if index is None:
        index = _local_rank()
    if name == registry.AUTO:
        name = next((n for n in registry.names() if backend_available(n)), "cpu")
    return backend_class(name)(index)


__all__ = [
    "BACKENDS",
    "Backend",
    "CpuBackend",
    "CudaBackend",
    "backend_available",
    "backend_class",
    "furiosa_available",
    "get_backend",
]
