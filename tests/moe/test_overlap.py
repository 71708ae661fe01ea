"""Overlapped hot/cold MoE forward == the sequential one, bitwise (fake async device = a thread)."""

from __future__ import annotations

import warnings

import pytest
import torch
from npu_lora.backends import CpuBackend
from npu_lora.moe.hot import hot_cold_forward, make_hot_layer
from npu_lora.moe.overlap import (
    StreamRunner,
    SyncRunner,
    ThreadRunner,
    hot_cold_forward_overlapped,
    runner_for,
)

from .moe_blocks import small_block

warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")


class SlowHot:
    """The hot device module, made slow, so the fake device really runs concurrently."""

    def __init__(self, fn, delay: float = 0.02) -> None:
        self.fn, self.delay = fn, delay
        self.threads: list[str] = []

    def __call__(self, *args):
        import threading
        import time

        self.threads.append(threading.current_thread().name)
        time.sleep(self.delay)
        return self.fn(*args)


@pytest.mark.parametrize("hot_ids", [[0, 3], [0, 1, 2, 3, 4, 5, 6, 7], [5]])
@pytest.mark.parametrize("grad", [True, False])
def test_overlapped_equals_sequential_bitwise(hot_ids, grad):
    blk = small_block()
    be_seq, be_ovl = CpuBackend(), CpuBackend()
    hot_seq = make_hot_layer(
        blk.experts, hot_ids, be_seq, buckets=(8, 16, 32, 64), device_dtype=torch.float32
    )
    hot_ovl = make_hot_layer(
        blk.experts, hot_ids, be_ovl, buckets=(8, 16, 32, 64), device_dtype=torch.float32
    )
    slow = SlowHot(hot_ovl.fn)
    hot_ovl.fn = slow
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(48, 64, generator=g)
    gy = torch.randn(48, 64, generator=g)
    runner = ThreadRunner()
    try:
        outs = []
        for be, hot, kw in ((be_seq, hot_seq, {}), (be_ovl, hot_ovl, {"runner": runner})):
            x = x0.clone().requires_grad_(grad)
            with torch.set_grad_enabled(grad):
                fn = hot_cold_forward if not kw else hot_cold_forward_overlapped
                y = fn(x, blk.gate, blk.experts, hot, be, 0, **kw)
            if grad:
                y.backward(gy)
            outs.append((y.detach(), x.grad))
    finally:
        runner.close()
    assert torch.equal(outs[0][0], outs[1][0])
    if grad:
        assert torch.equal(outs[0][1], outs[1][1])
    else:
        assert not outs[1][0].requires_grad
    assert slow.threads and all(t.startswith("fake-device") for t in slow.threads)
    # counted exactly like the sequential Backend.call
    assert be_ovl.calls_by_name == be_seq.calls_by_name
    assert be_ovl.calls_by_layer == be_seq.calls_by_layer


def test_cpu_backend_stays_sequential():
    assert isinstance(runner_for(CpuBackend()), SyncRunner)
    r = SyncRunner()
    assert r.wait(r.submit(lambda a: a + 1, 1)) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs cuda")
def test_stream_runner_cuda():  # pragma: no cover - only with a GPU
    r = StreamRunner(torch.device("cuda"))
    a = torch.randn(64, 64, device="cuda")
    out = r.wait(r.submit(torch.mm, a, a))
    torch.testing.assert_close(out, a @ a)
