"""Machine limits: STREAM-style memory bandwidth in torch, and what fraction of it the host MoE uses.

Why bandwidth: a host MoE forward at fine-tuning batch sizes reads every hit expert's weights once
for a handful of tokens each (T=128, top-8 of 128 experts: ~8 tokens per expert), so it is bound
by memory bandwidth, not FLOPs. The roofline is therefore "hit expert bytes / copy bandwidth".

STREAM kernels, in torch with the process's intra-op thread count (the same threads the host MoE
uses), arrays far larger than the last-level cache:

- copy:  ``c[:] = a``          bytes moved = 2 · n · elem (read a, write c)
- triad: ``a[:] = b + s · c``  bytes moved = 3 · n · elem (read b, c, write a), as
  ``torch.add(b, c, alpha=s, out=a)`` (one fused pass).

STREAM counts bytes this way (no write-allocate traffic), so the numbers are comparable with
published STREAM figures. Each is the median of ``repeats`` timed runs after one untimed run.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

#: Default array size: 96 Mi float32 = 384 MiB per array (1.1 GiB for the three), larger than the
#: 300 MiB L3 this VM reports, so no pass can be served from cache.
DEFAULT_ELEMS = 96 * 1024 * 1024


@dataclass
class Bandwidth:
    copy_gbs: float
    triad_gbs: float
    copy_samples_gbs: list[float] = field(default_factory=list)
    triad_samples_gbs: list[float] = field(default_factory=list)
    threads: int = 1
    elems: int = 0
    dtype: str = "float32"
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def to_dict(self) -> dict:
        return asdict(self)


def stream_bandwidth(
    *, elems: int = DEFAULT_ELEMS, repeats: int = 7, dtype: torch.dtype = torch.float32
) -> Bandwidth:
    """Copy and triad bandwidth (GB/s = 1e9 B/s), median of ``repeats``."""
    a = torch.rand(elems, dtype=dtype)
    b = torch.rand(elems, dtype=dtype)
    c = torch.empty(elems, dtype=dtype)
    esz = a.element_size()
    copy_s, triad_s = [], []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        c.copy_(a)
        t1 = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        t2 = time.perf_counter()
        if i:  # the first pass faults pages in
            copy_s.append(2 * elems * esz / (t1 - t0) / 1e9)
            triad_s.append(3 * elems * esz / (t2 - t1) / 1e9)
    return Bandwidth(
        copy_gbs=statistics.median(copy_s),
        triad_gbs=statistics.median(triad_s),
        copy_samples_gbs=copy_s,
        triad_samples_gbs=triad_s,
        threads=torch.get_num_threads(),
        elems=elems,
        dtype=str(dtype).removeprefix("torch."),
        loadavg=os.getloadavg(),
    )


def hit_bytes(counts_E: torch.Tensor, per_expert_bytes: int) -> int:
    """Weight bytes a forward must read: experts with at least one token × their bytes."""
    return int((counts_E > 0).sum()) * per_expert_bytes


def effective_bandwidth(bytes_read: float, seconds: float) -> float:
    """GB/s achieved (1e9 B/s); 0 when nothing was timed."""
    return bytes_read / seconds / 1e9 if seconds > 0 else 0.0


def fraction_of(bw_gbs: float, ref_gbs: float) -> float:
    return bw_gbs / ref_gbs if ref_gbs > 0 else 0.0
