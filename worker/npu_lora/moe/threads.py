"""Threads of the host MoE block: the experts kernel gets torch's intra-op threads, everything
around it (router, casts, routing bookkeeping, the router's backward) runs on one.

Why: the ops around the kernel are small (at Qwen3-30B-A3B widths and T = 128 tokens a cast of
the block input is 1 MB, the router GEMM 67 MFLOP), and an OpenMP parallel region of torch waits
at its end for every thread it started. On a shared or oversubscribed host one of them is often
descheduled, and then a 20 µs cast takes a scheduler slice: measured on the 2-core Zen 5 guest at
load 6, a fp32→bf16 cast of [128, 2048] took a median 16 ms with 2 threads and 22 µs with one, the
router's ``F.linear`` a mean of 15 ms against 2 ms (experiments/2026-12-03-engine-vs-kernel.md).
The stream kernel itself hands out (expert, row block) tasks from a shared counter, so a thread
that is descheduled only takes fewer tasks; it keeps every thread.

:func:`small_ops` sets one thread for its block and remembers the count it replaced;
:func:`kernel_threads` (around the kernel's calls) restores that count inside such a block and
is a no-op outside one. Both act on the calling thread (torch's OpenMP thread count is a
per-thread setting; the autograd engine runs CPU backward functions on the caller's thread).
``NPU_LORA_HOST_SMALL_OPS=0`` turns the policy off (every op gets all threads, as before).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_local = threading.local()


def enabled() -> bool:
    return os.environ.get("NPU_LORA_HOST_SMALL_OPS", "1") != "0"


@contextmanager
def small_ops(on: bool = True) -> Iterator[None]:
    """One intra-op thread for the block (``on`` and :func:`enabled`), all of them again after."""
    n = torch.get_num_threads()
    if not on or not enabled() or n == 1 or getattr(_local, "full", None) is not None:
        yield
        return
    _local.full = n
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
        _local.full = None


@contextmanager
def kernel_threads() -> Iterator[None]:
    """Inside :func:`small_ops`: the threads it replaced, for the kernel call; else nothing."""
    full = getattr(_local, "full", None)
    if full is None:
        yield
        return
    torch.set_num_threads(full)
    try:
        yield
    finally:
        torch.set_num_threads(1)
