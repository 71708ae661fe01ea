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
from typing import Any

__all__ = ["machine_facts"]

#: Instruction-set flags worth recording (``/proc/cpuinfo`` names): what the host kernels use.
_ISA_PREFIXES = ("avx2", "avx512f", "avx512_bf16", "amx")
_DISTRIBUTIONS = ("torch", "transformers", "furiosa-torch", "furiosa-kernels")


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
    backend = getattr(engine, "backend", None)
    if backend is not None:
        facts["backend"] = getattr(backend, "name", type(backend).__name__)
        dev = getattr(backend, "device", None)
        if dev is not None:
            facts["device"] = str(dev)
    return facts
