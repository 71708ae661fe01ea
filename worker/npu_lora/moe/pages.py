"""Host expert weights in transparent huge pages where Linux gives them only on request.

Why: the host experts kernels stream every hit expert's weight rows once per direction and
prefetch rows ahead of use, so each 4 KiB page of weights (one bf16 row at H=2048) costs a TLB
miss and, in a VM, a two-level page walk. With 2 MiB pages one TLB entry covers 512 of them.
Linux backs anonymous memory with transparent huge pages (THP) by itself in mode ``always``; in
mode ``madvise`` (the default of several distributions, and of the VMs our figures come from)
only ranges advised with ``madvise(MADV_HUGEPAGE)`` before their first touch. Measured on a
2-core AMD EPYC (AVX2, KVM guest, THP ``madvise``), one process, alternating: the
``npu_lora_stream`` layer ran 0-4 % faster with its weights in huge pages, most where it is
memory bound (fp32 at T=128), within noise at the engine step level
(``experiments/2026-12-02-hugepages.md``); a plain copy was unchanged.

Rule (:func:`place_experts`, called once when the model is built): when THP is ``madvise``,
each expert weight tensor of at least one huge page is copied once into a private anonymous
mapping aligned to the huge-page size and advised before the copy touches it, and the parameter
is pointed at it (``p.data``; same values, dtype, shape and ``requires_grad``). ``always``
needs nothing, ``never`` (or no THP, or not Linux) leaves the weights where they are.
``NPU_LORA_HUGEPAGES=0`` turns it off. What happened is recorded (``summary.json``
``machine.experts_pages``; ``huge_bytes`` is what the kernel actually backed with huge pages,
read from ``/proc/self/smaps``: memory fragmentation can leave it below ``placed_bytes``).

Reserved huge pages first (hugetlb, :func:`relocate_hugetlb`): where the process may map 2 MiB
pages from the kernel's reserved pool — a Kubernetes pod that requested ``hugepages-2Mi`` (its
cgroup's ``hugetlb.2MB`` limit), or a host with free pool pages — each expert tensor that fits
the remaining budget (:func:`hugetlb_budget`: free pool pages less reservations, capped by the
cgroup's limit less its usage) is copied into a ``MAP_HUGETLB`` mapping instead: the pages are
reserved at ``mmap`` (an empty pool fails there, never at first touch) and never split, swapped
or compacted. What does not fit goes to THP as above. ``NPU_LORA_HUGEPAGES``: ``0`` off,
``thp`` THP only, ``hugetlb`` or unset (``auto``) reserved pages first. The report adds
``hugetlb_tensors``/``hugetlb_bytes``.

The mapping belongs to the tensor's storage (``torch.frombuffer`` keeps it alive and it is
unmapped with the last reference); the storage holds exactly the tensor's bytes, so
``torch.save``/safetensors and ``share_memory_()`` see an ordinary tensor.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from npu_lora.machine import HUGEPAGES_ENV, huge_page_bytes, hugetlb_budget, thp_mode
from npu_lora.models.build import EXPERT_PARAM_NAMES

__all__ = [
    "ENV",
    "hugetlb_budget",
    "place_experts",
    "relocate",
    "relocate_hugetlb",
    "resident_huge_bytes",
]

#: ``NPU_LORA_HUGEPAGES=0``: leave the expert weights in the allocator's memory.
ENV = HUGEPAGES_ENV
_MADV_HUGEPAGE = 14  # <linux/mman.h>
_MAP_HUGETLB = getattr(mmap, "MAP_HUGETLB", 0x40000)  # <asm-generic/mman-common.h>


def relocate_hugetlb(t: torch.Tensor) -> torch.Tensor | None:
    """A contiguous copy of CPU tensor ``t`` in a private ``MAP_HUGETLB`` mapping (reserved
    huge pages, allocated when mapped), or None when the kernel refuses the mapping (no free
    pages, no hugetlb support)."""
    if t.device.type != "cpu":
        raise ValueError(f"relocate_hugetlb: a CPU tensor is needed, got one on {t.device}")
    huge = huge_page_bytes()
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return None
    size = (nbytes + huge - 1) // huge * huge
    try:
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_HUGETLB)
    except OSError:
        return None
    out = torch.frombuffer(m, dtype=t.dtype, count=t.numel()).view(t.shape)
    out.copy_(t)
    return out


def resident_hugetlb_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the hugetlb mappings that hold ``tensors`` (``/proc/self/smaps``
    ``Private_Hugetlb`` + ``Shared_Hugetlb``, each mapping once); 0 where not readable."""
    return _smaps_total(tensors, ("Private_Hugetlb:", "Shared_Hugetlb:"))


def _madvise(addr: int, length: int) -> None:
    """Advice only: where it fails the copy lands in ordinary pages (``huge_bytes`` says so)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise(addr, length, _MADV_HUGEPAGE)


def relocate(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of CPU tensor ``t`` in a private anonymous mapping aligned to the huge
    page size and advised ``MADV_HUGEPAGE`` before the copy touches it."""
    if t.device.type != "cpu":
        raise ValueError(f"relocate: a CPU tensor is needed, got one on {t.device}")
    huge = huge_page_bytes()
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return t.clone()
    m = mmap.mmap(-1, nbytes + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = (ctypes.c_char * 1).from_buffer(m)
    base = ctypes.addressof(view)
    del view  # the buffer export must end before the mapping can be closed
    off = (-base) % huge
    _madvise(base + off, (nbytes + huge - 1) // huge * huge)
    out = torch.frombuffer(m, dtype=t.dtype, count=t.numel(), offset=off).view(t.shape)
    out.copy_(t)
    return out


def resident_huge_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of huge pages (``AnonHugePages``) in the mappings that hold ``tensors`` (each
    mapping counted once), from ``/proc/self/smaps``; 0 where that is not readable."""
    return _smaps_total(tensors, ("AnonHugePages:",))


def _smaps_total(tensors: Iterable[torch.Tensor], keys: tuple[str, ...]) -> int:
    ptrs = [t.data_ptr() for t in tensors]
    total, seen = 0, set()
    with contextlib.suppress(OSError), open("/proc/self/smaps", encoding="utf-8") as f:
        hit: tuple[int, int] | None = None
        for line in f:
            head = line.split(maxsplit=1)[0] if line.strip() else ""
            if "-" in head and not head.endswith(":"):
                a, _, b = head.partition("-")
                try:
                    lo, hi = int(a, 16), int(b, 16)
                except ValueError:
                    continue
                hit = (lo, hi) if any(lo <= p < hi for p in ptrs) else None
            elif hit is not None and line.startswith(keys) and (hit, line[:16]) not in seen:
                seen.add((hit, line[:16]))
                total += int(line.split()[1]) * 1024
    return total


def place_experts(blocks: Iterable[nn.Module]) -> dict[str, Any]:
    """Put the expert weights (``experts.gate_up_proj`` / ``down_proj``) of the MoE ``blocks``
    (or of experts modules) in huge pages where THP needs asking (module docstring); returns
    ``{"thp", "placed_tensors", "placed_bytes", "huge_bytes"}`` (``reason`` when nothing was)."""
    mode = thp_mode()
    info: dict[str, Any] = {"thp": mode, "placed_tensors": 0, "placed_bytes": 0, "huge_bytes": 0}
    want = os.environ.get(ENV, "auto")
    if want == "0":
        return {**info, "reason": f"{ENV}=0"}
    huge = huge_page_bytes()
    budget = hugetlb_budget(huge) if want in ("auto", "hugetlb", "1") else 0
    thp = mode == "madvise"  # None off Linux; ``always`` needs no asking
    if not budget and not thp:
        reason = "THP always: nothing to ask" if mode == "always" else "no THP to ask for"
        return {**info, "reason": reason}
    placed: list[torch.Tensor] = []
    reserved: list[torch.Tensor] = []
    with torch.no_grad():
        for block in blocks:
            experts = getattr(block, "experts", block)  # a MoE block, or its experts
            for name in EXPERT_PARAM_NAMES:
                p = getattr(experts, name, None)
                if not isinstance(p, torch.Tensor) or p.device.type != "cpu":
                    continue
                nbytes = p.numel() * p.element_size()
                if nbytes < huge:  # not one huge page: nothing to gain
                    continue
                rounded = (nbytes + huge - 1) // huge * huge
                out = relocate_hugetlb(p.data) if rounded <= budget else None
                if out is not None:
                    budget -= rounded
                    p.data = out
                    reserved.append(out)
                elif thp:
                    p.data = relocate(p.data)
                    placed.append(p.data)
    info["placed_tensors"] = len(placed)
    info["placed_bytes"] = sum(t.numel() * t.element_size() for t in placed)
    info["huge_bytes"] = resident_huge_bytes(placed) if placed else 0
    info["hugetlb_tensors"] = len(reserved)
    info["hugetlb_bytes"] = resident_hugetlb_bytes(reserved) if reserved else 0
    return info
