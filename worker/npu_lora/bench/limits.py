"""Machine limits: STREAM-style memory bandwidth in torch, and what fraction of it the host MoE uses.

Why bandwidth: a host MoE forward at fine-tuning batch sizes reads every hit expert's weights once
for a handful of tokens each (T=128, top-8 of 128 experts: ~8 tokens per expert), so it is bound
by memory bandwidth, not FLOPs. The roofline is therefore "hit expert bytes / copy bandwidth".

STREAM kernels, in torch with the process's intra-op thread count (the same threads the host MoE
uses), arrays far larger than the last-level cache:

- read:  ``a.sum()``           bytes moved = n · elem (read only; the access pattern of a host
  MoE forward, which reads its weights and writes little), on request (``CopyProbe.measure(read=True)``)
- copy:  ``c[:] = a``          bytes moved = 2 · n · elem (read a, write c)
- triad: ``a[:] = b + s · c``  bytes moved = 3 · n · elem (read b, c, write a), as
  ``torch.add(b, c, alpha=s, out=a)`` (one fused pass).

STREAM counts bytes this way (no write-allocate traffic), so the numbers are comparable with
published STREAM figures. Each is the median of ``repeats`` timed runs after one untimed run.
"""

from __future__ import annotations

import math
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
    read_gbs: float = math.nan  # read-only bandwidth, when measured (``measure(read=True)``)
    read_samples_gbs: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class CopyProbe:
    """Copy and triad bandwidth on buffers allocated once and reused by every :meth:`measure`.

    A rotation samples the bandwidth between kernel calls; allocating (and freeing) the buffers
    per sample made the sample itself re-fault its pages and, on a VM guest whose freed pages are
    handed back to the host, slowed the call right after it (measured on a Zen 4 KVM guest: the
    forward after a per-sample allocation of 3 x 1.2 GB ran 180-208 ms against 109-114 ms,
    experiments/2026-12-02-zen4-native-bf16.md). The buffers are faulted in once, here.
    """

    def __init__(self, elems: int = DEFAULT_ELEMS, dtype: torch.dtype = torch.float32) -> None:
        self.a = torch.rand(elems, dtype=dtype)
        self.b = torch.rand(elems, dtype=dtype)
        self.c = torch.zeros(elems, dtype=dtype)
        self.elems, self.dtype = elems, dtype

    def measure(self, repeats: int = 7, *, read: bool = False) -> Bandwidth:
        """Copy (2·bytes / time) and triad (3·bytes / time), GB/s = 1e9 B/s, median of
        ``repeats`` after one unmeasured pass; with ``read``, also read-only (bytes / time of
        ``a.sum()``), each repeat in the order read, copy, triad."""
        a, b, c, elems = self.a, self.b, self.c, self.elems
        esz = a.element_size()
        read_s: list[float] = []
        copy_s, triad_s = [], []
        for i in range(repeats + 1):
            if read:
                r0 = time.perf_counter()
                a.sum()
                if i:
                    read_s.append(elems * esz / (time.perf_counter() - r0) / 1e9)
            t0 = time.perf_counter()
            c.copy_(a)
            t1 = time.perf_counter()
            torch.add(b, c, alpha=3.0, out=a)
            t2 = time.perf_counter()
            if i:  # the first pass warms the caches and TLBs
                copy_s.append(2 * elems * esz / (t1 - t0) / 1e9)
                triad_s.append(3 * elems * esz / (t2 - t1) / 1e9)
        a.copy_(b)  # keep the values bounded over many samples (a = b + 3c grows otherwise)
        return Bandwidth(
            copy_gbs=statistics.median(copy_s),
            triad_gbs=statistics.median(triad_s),
            copy_samples_gbs=copy_s,
            triad_samples_gbs=triad_s,
            threads=torch.get_num_threads(),
            elems=elems,
            dtype=str(self.dtype).removeprefix("torch."),
            loadavg=os.getloadavg(),
            read_gbs=statistics.median(read_s) if read_s else math.nan,
            read_samples_gbs=read_s,
        )


def stream_bandwidth(
    *, elems: int = DEFAULT_ELEMS, repeats: int = 7, dtype: torch.dtype = torch.float32
) -> Bandwidth:
    """Copy and triad bandwidth (GB/s = 1e9 B/s), median of ``repeats``, on fresh buffers (a
    one-off sample; a rotation keeps one :class:`CopyProbe`)."""
    return CopyProbe(elems, dtype).measure(repeats)


def hit_bytes(counts_E: torch.Tensor, per_expert_bytes: int) -> int:
    """Weight bytes a forward must read: experts with at least one token × their bytes."""
    return int((counts_E > 0).sum()) * per_expert_bytes


def effective_bandwidth(bytes_read: float, seconds: float) -> float:
    """GB/s achieved (1e9 B/s); 0 when nothing was timed."""
    return bytes_read / seconds / 1e9 if seconds > 0 else 0.0


def fraction_of(bw_gbs: float, ref_gbs: float) -> float:
    return bw_gbs / ref_gbs if ref_gbs > 0 else 0.0
