"""Build and load the streaming experts C++ extension (``stream*.cpp``), or report why not.

The extension is compiled on first use with ``torch.utils.cpp_extension.load`` (ninja, g++ -O3)
into ``$NPU_LORA_KERNEL_CACHE/kernels`` (default ``$XDG_CACHE_HOME/npu-lora``, else
``~/.cache/npu-lora``), keyed by the sources'
hash and torch's version, so a worker builds it once per image/host. It holds four instances of
the micro-kernels, each compiled for one instruction set with ``#pragma GCC target``
(AMX tiles, AVX-512 + AVX512-BF16 with native bf16 dot products, AVX-512, AVX2+FMA,
baseline); the one used is chosen at run time from what the CPU supports (the
extension's ``cpu_isas``), so one build runs on every x86-64 CPU and the slower paths can be tested
on a fast CPU. ``-march=native`` is deliberately not used: it would let the compiler put AVX-512
into the baseline and AVX2 instances.

``NPU_LORA_STREAM_EXT=0`` disables the extension (the kernel then uses its pure-torch fallback);
``NPU_LORA_STREAM_ISA=base|avx2|avx512|avx512bf16|amx`` forces a path (must be one the CPU runs).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_SRC_DIR = Path(__file__).parent
SOURCES = (
    "stream.cpp",
    "stream_amx.cpp",
    "stream_avx512bf16.cpp",
    "stream_avx512.cpp",
    "stream_avx2.cpp",
    "stream_base.cpp",
)
HEADERS = ("stream_isa.h", "stream_core.h", "stream_avx512_v.h")
ISA_CODES = {"base": 0, "avx2": 1, "avx512": 2, "avx512bf16": 3, "amx": 4}
#: ISAs whose bf16 path widens the weights and runs the fp32 tiles (avx512bf16 and amx compute
#: natively)
WIDENING_ISAS = ("base", "avx2", "avx512")
#: ISAs that compute bf16 natively: ``vdpbf16ps`` (AVX512-BF16) or AMX tiles (``tdpbf16ps``)
NATIVE_ISAS = ("avx512bf16", "amx")
_NATIVE_HOW = {
    "avx512bf16": "vdpbf16ps, fp32 accumulation",
    "amx": "AMX tiles, tdpbf16ps, fp32 accumulation",
}


def native_how(isa: str | None) -> str | None:
    """How ``isa`` computes bf16 natively (``None``: it widens bf16 to fp32, or no extension)."""
    return _NATIVE_HOW.get(isa or "")


#: Compiler and linker flags (part of the cache key).
CFLAGS = ("-O3", "-fno-math-errno", "-fopenmp")
LDFLAGS = ("-fopenmp",)

_lock = threading.Lock()
_state: dict[str, Any] = {}


def cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = os.environ.get("NPU_LORA_KERNEL_CACHE") or str(Path(xdg) / "npu-lora")
    return Path(root) / "kernels"


def _digest() -> str:
    import torch

    h = hashlib.sha256(torch.__version__.encode())
    h.update(" ".join((*CFLAGS, *LDFLAGS)).encode())
    for name in (*SOURCES, *HEADERS):
        h.update((_SRC_DIR / name).read_bytes())
    return h.hexdigest()[:12]


def load() -> Any | None:
    """The compiled extension module, or ``None`` (disabled or the build failed; logged once)."""
    with _lock:
        if "mod" in _state:
            return _state["mod"]
        mod = None
        if os.environ.get("NPU_LORA_STREAM_EXT", "1") == "0":
            _state["error"] = "disabled by NPU_LORA_STREAM_EXT=0"
        else:
            try:
                from torch.utils.cpp_extension import load as cpp_load

                name = f"npu_lora_stream_{_digest()}"
                build = cache_dir() / name
                build.mkdir(parents=True, exist_ok=True)
                mod = cpp_load(
                    name=name,
                    sources=[str(_SRC_DIR / s) for s in SOURCES],
                    # -fopenmp: at::parallel_for is inline OpenMP code in torch's headers;
                    # without the flag it silently runs on one thread. The library resolves to
                    # the libgomp torch has loaded (same soname), so there is one thread pool.
                    extra_cflags=list(CFLAGS),
                    extra_ldflags=list(LDFLAGS),
                    build_directory=str(build),
                    verbose=False,
                )
            except Exception as exc:  # any build failure means: use the fallback
                _state["error"] = f"{type(exc).__name__}: {str(exc).strip()[-500:]}"
                log.warning(
                    "npu_lora_stream extension unavailable, using the torch fallback: %s",
                    _state["error"],
                )
        _state["mod"] = mod
        return mod


def error() -> str | None:
    """Why :func:`load` returned ``None`` (after it was called)."""
    return _state.get("error")


def isa() -> str | None:
    """The instruction-set path the kernel uses on this CPU (``None`` without the extension)."""
    if load() is None:
        return None
    runs = cpu_isas()
    forced = os.environ.get("NPU_LORA_STREAM_ISA")
    if forced:
        if forced not in ISA_CODES or forced not in runs:
            raise ValueError(
                f"NPU_LORA_STREAM_ISA={forced!r}: this CPU runs {runs} (allowed: {list(ISA_CODES)})"
            )
        return forced
    return runs[-1]


def cpu_isas() -> list[str]:
    """The paths this CPU runs, slowest first (asked of the extension once: it also requests the
    AMX tile state; :func:`isa` runs on every experts call)."""
    if "isas" not in _state:
        mod = load()
        _state["isas"] = list(mod.cpu_isas()) if mod is not None else []
    return list(_state["isas"])
