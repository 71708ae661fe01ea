"""Facts about the machine a measurement ran on (``summary.json``, the bench, the RNGD check).

Torch-free: torch's thread count is read only when torch is already imported.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["cpu_capabilities", "huge_page_bytes", "machine_facts", "thp_mode"]

#: Instruction-set flags worth recording (``/proc/cpuinfo`` names): what the host kernels use.
_ISA_PREFIXES = ("avx2", "avx512f", "avx512_bf16", "amx")
_DISTRIBUTIONS = ("torch", "transformers", "furiosa-torch", "furiosa-kernels")


def kernel_cache_root() -> Path:
    """Where the host kernels are built and looked up (``npu_lora.moe.kernels``):
    ``$NPU_LORA_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/npu-lora``, else ``~/.cache/npu-lora``.
    The worker image sets ``NPU_LORA_KERNEL_CACHE=/opt/npu-lora/cache`` (built at image build
    time); the sandbox gives its subprocess pods this process's root, as the image would."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("NPU_LORA_KERNEL_CACHE") or str(Path(xdg) / "npu-lora"))


def _cpuinfo() -> dict[str, str]:
    out: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            key, _, val = line.partition(":")
            key = key.strip()
            if key in ("model name", "flags") and key not in out:
                out[key] = val.strip()
            if len(out) == 2:
                break
    return out


def _meminfo_gib() -> dict[str, float]:
    out: dict[str, float] = {}
    with (
        contextlib.suppress(OSError, ValueError, IndexError),
        open("/proc/meminfo", encoding="utf-8") as f,
    ):
        for line in f:
            key, _, val = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key] = round(int(val.split()[0]) / 2**20, 1)
    return out


#: Instruction sets the host experts kernels care about (``/proc/cpuinfo`` flag names).
_CAP_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_bf16",
              "amx_tile", "avx_vnni")  # fmt: skip


def _cache_sizes() -> dict[str, str]:
    """cpu0's caches from sysfs, e.g. ``{"L1d": "48K", "L2": "2048K", "L3": "266240K"}``."""
    out: dict[str, str] = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    with contextlib.suppress(OSError):
        for d in sorted(os.listdir(base)):
            if not d.startswith("index"):
                continue
            with contextlib.suppress(OSError):
                level, kind, size = (
                    Path(f"{base}/{d}/{k}").read_text(encoding="utf-8").strip()
                    for k in ("level", "type", "size")
                )
                suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
                out[f"L{level}{suffix}"] = size
    return out


def _numa_nodes() -> int | None:
    with contextlib.suppress(OSError):
        nodes = [d for d in os.listdir("/sys/devices/system/node") if d[4:].isdigit()]
        return len(nodes) or None
    return None


_THP = "/sys/kernel/mm/transparent_hugepage"


def thp_mode(root: str = _THP) -> str | None:
    """Linux's transparent huge page mode (``always``, ``madvise`` or ``never``); None where
    there is none (not Linux, or a kernel without THP)."""
    with contextlib.suppress(OSError):
        text = Path(root, "enabled").read_text(encoding="utf-8")
        if "[" in text:
            return text.split("[", 1)[1].split("]", 1)[0]
    return None


def huge_page_bytes(root: str = _THP) -> int:
    """The PMD huge page size (2 MiB on x86-64)."""
    with contextlib.suppress(OSError, ValueError):
        return int(Path(root, "hpage_pmd_size").read_text(encoding="utf-8"))
    return 2 << 20


#: ``NPU_LORA_HUGEPAGES``: ``0`` the host experts stay in the allocator's pages, ``thp`` only
#: transparent huge pages, unset/``auto``/``hugetlb`` reserved 2 MiB pages first
#: (:mod:`npu_lora.moe.pages`)
HUGEPAGES_ENV = "NPU_LORA_HUGEPAGES"
_CGROUP = "/sys/fs/cgroup"


def _meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def _read_int(path: str) -> int | None:
    """An integer file (``max``: None, unlimited); None when absent."""
    with contextlib.suppress(OSError, ValueError):
        text = open(path, encoding="utf-8").read().strip()  # noqa: SIM115
        return None if text == "max" else int(text)
    return None


def _cgroup_hugetlb_room(huge: int, root: str = _CGROUP) -> int | None:
    """Bytes of ``huge``-sized hugetlb pages the process's cgroup may still charge (its limit,
    what a pod's ``hugepages-2Mi`` sets, less its usage); None when no limit applies."""
    tag = f"{huge >> 20}MB" if huge < 1 << 30 else f"{huge >> 30}GB"
    for limit, usage in (
        (f"{root}/hugetlb.{tag}.max", f"{root}/hugetlb.{tag}.current"),  # cgroup v2
        (
            f"{root}/hugetlb/hugetlb.{tag}.limit_in_bytes",  # cgroup v1
            f"{root}/hugetlb/hugetlb.{tag}.usage_in_bytes",
        ),
    ):
        lim = _read_int(limit)
        if lim is not None and lim < 1 << 62:  # v1 spells "unlimited" as a huge number
            return max(0, lim - (_read_int(usage) or 0))
    return None


def hugetlb_budget(
    huge: int | None = None, *, meminfo: str = "/proc/meminfo", cgroup: str = _CGROUP
) -> int:
    """Bytes of reserved huge pages this process may still map: the pool's free pages less the
    reservations (``meminfo``, when its default page size is ``huge``), capped by the cgroup's
    hugetlb room (a pod's ``hugepages-2Mi`` limit less its usage); 0 when there are none."""
    huge = huge or huge_page_bytes()
    info = _meminfo(meminfo)
    if info.get("Hugepagesize") != huge:
        return 0
    pool = max(0, info.get("HugePages_Free", 0) - info.get("HugePages_Rsvd", 0)) * huge
    room = _cgroup_hugetlb_room(huge, cgroup)
    return pool if room is None else min(pool, room)


def cpu_capabilities() -> dict[str, Any]:
    """The host capability probe (one place): instruction sets, cores, NUMA nodes, caches.

    ``native_bf16``: the CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16), so torch's bf16
    matmuls do not fall back to a slow path (measured 75-110x slower than fp32 in backward on an
    AVX2-only EPYC, issue 10)."""
    flags = set(_cpuinfo().get("flags", "").split())
    isa = [f for f in _CAP_FLAGS if f in flags]
    cores = os.cpu_count()
    with contextlib.suppress(AttributeError, OSError):
        cores = len(os.sched_getaffinity(0))
    return {
        "isa": isa,
        "native_bf16": "avx512_bf16" in flags or "amx_bf16" in flags,
        "cores": cores,
        "numa_nodes": _numa_nodes(),
        "caches": _cache_sizes(),
        "thp": thp_mode(),  # transparent huge pages (npu_lora.moe.pages)
    }


def machine_facts(engine: Any = None) -> dict[str, Any]:
    """CPU model and instruction sets, cores, memory, load, versions; the engine's backend and
    device when ``engine`` is given."""
    cpu = _cpuinfo()
    mem = _meminfo_gib()
    flags = cpu.get("flags", "").split()
    facts: dict[str, Any] = {
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "cpu_model": cpu.get("model name"),
        "cpu_flags": " ".join(f for f in flags if f.startswith(_ISA_PREFIXES)),
        "cpu_count": os.cpu_count(),
        "mem_gib": mem.get("MemTotal"),
        "mem_available_gib": mem.get("MemAvailable"),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cpu_capabilities": cpu_capabilities(),
    }
    with contextlib.suppress(AttributeError, OSError):
        facts["cpu_affinity"] = len(os.sched_getaffinity(0))
    if "torch" in sys.modules:
        facts["torch_threads"] = sys.modules["torch"].get_num_threads()
    for dist in _DISTRIBUTIONS:
        try:
            facts[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            facts[dist] = None
    host = getattr(engine, "host_choice", None)
    if host is not None:  # moe.hostDtype as resolved (npu_lora.moe.host_dtype)
        facts["host"] = host.to_dict()
    pages = getattr(engine, "experts_pages", None)
    if pages is not None:  # expert weights in huge pages (npu_lora.moe.pages)
        facts["experts_pages"] = pages
    backend = getattr(engine, "backend", None)
    if backend is not None:
        facts["backend"] = getattr(backend, "name", type(backend).__name__)
        dev = getattr(backend, "device", None)
        if dev is not None:
            facts["device"] = str(dev)
    return facts
