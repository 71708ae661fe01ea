"""``npu_lora_sorted``: the fast host experts kernel against transformers' ``eager`` kernel."""

from __future__ import annotations

import warnings

import pytest
import torch
from npu_lora.moe import experts as ex
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from .moe_blocks import run_block, stock_block

warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")

IMPLS = [ex.NAME, ex.NAME_GROUPED, ex.NAME_LOOP]


_block = stock_block


_run = run_block


def test_register_is_idempotent():
    names = ex.register()
    n = len(ALL_EXPERTS_FUNCTIONS)
    assert ex.register() == names
    assert len(ALL_EXPERTS_FUNCTIONS) == n
    for name in names:
        assert name in ALL_EXPERTS_FUNCTIONS


@pytest.mark.parametrize("impl", IMPLS)
def test_fp32_matches_eager_incl_grads(impl):
    blk, cfg = _block(torch.float32)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(2, 24, 64, generator=g)
    gy = torch.randn(2, 24, 64, generator=g)
    ref = _run(blk, cfg, "eager", x0, gy)
    got = _run(blk, cfg, impl, x0, gy)
    for name, a, b in zip(("y", "dx", "d_router", "d_gate_up", "d_down"), got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("impl", [ex.NAME_GROUPED, ex.NAME_LOOP])
def test_bf16_close_to_eager(impl):
    blk, cfg = _block(torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(2, 24, 64, generator=g).bfloat16()
    gy = torch.randn(2, 24, 64, generator=g).bfloat16()
    ref = _run(blk, cfg, "eager", x0, gy)
    got = _run(blk, cfg, impl, x0, gy)
    for name, a, b in zip(("y", "dx", "d_router", "d_gate_up", "d_down"), got, ref, strict=True):
        # bf16 (8-bit mantissa): rounding points differ (eager accumulates index_add_ in bf16)
        scale = b.float().abs().max().item()
        err = (a.float() - b.float()).abs().max().item()
        assert err <= 2e-2 * scale + 1e-3, f"{name}: max err {err} vs scale {scale}"


def test_frozen_experts_and_unhit_experts():
    """LoRA case (experts frozen); more experts than pairs → many experts unhit; top-1 (hot path)."""
    blk, cfg = _block(torch.float32, E=64, K=1)
    blk.experts.requires_grad_(False)
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(1, 8, 64, generator=g)
    gy = torch.randn(1, 8, 64, generator=g)
    ref = _run(blk, cfg, "eager", x0, gy)
    for impl in IMPLS:
        got = _run(blk, cfg, impl, x0, gy)
        assert got[3] is None and got[4] is None
        for a, b in zip(got[:3], ref[:3], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_deterministic_with_threads():
    """Bitwise equal across repeated runs with several threads (no index_add_ in forward/backward)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(max(2, prev))
    try:
        blk, cfg = _block(torch.float32, E=8, K=2, H=128, inter=64)
        g = torch.Generator().manual_seed(4)
        x0 = torch.randn(4, 64, 128, generator=g)
        gy = torch.randn(4, 64, 128, generator=g)
        for impl in (ex.NAME_GROUPED, ex.NAME_LOOP):
            a = _run(blk, cfg, impl, x0, gy)
            b = _run(blk, cfg, impl, x0, gy)
            for u, v in zip(a, b, strict=True):
                assert torch.equal(u, v)
    finally:
        torch.set_num_threads(prev)


def test_functional_matches_grouped_mm_kernel_fp32():
    """Same per-pair products and the same top-k summation order as transformers' grouped_mm."""
    blk, cfg = _block(torch.float32)
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(1, 40, 64, generator=g)
    gy = torch.randn(1, 40, 64, generator=g)
    ref = _run(blk, cfg, "grouped_mm", x0, gy)
    got = _run(blk, cfg, ex.NAME_GROUPED, x0, gy)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-6, atol=1e-6)


def test_routing_bookkeeping():
    idx = torch.tensor([[3, 1], [1, 0], [3, 2]])
    r = ex.build_routing(idx, 5)
    flat = idx.reshape(-1)
    assert flat[r.perm].tolist() == [0, 1, 1, 2, 3, 3]
    assert r.perm.tolist() == [3, 1, 2, 5, 0, 4]  # stable: token order inside an expert
    assert r.counts == [1, 2, 1, 2, 0]
    assert r.offsets.tolist() == [1, 3, 4, 6, 6]
    assert r.hit_experts == [0, 1, 2, 3]
    assert torch.equal(r.perm[r.inv_perm], torch.arange(6))
    assert r.token_idx.tolist() == [1, 0, 1, 2, 0, 2]


def test_hit_expert_bytes():
    gu = torch.zeros(4, 6, 3)
    dn = torch.zeros(4, 3, 3)
    idx = torch.tensor([[0, 2], [2, 0]])
    assert ex.hit_expert_bytes(idx, gu, dn) == 2 * (18 + 9) * 4


@pytest.mark.parametrize("impl", IMPLS)
def test_trained_experts_with_unhit_experts(impl):
    """Expert weight gradients when some experts get no token (zeros, like eager)."""
    blk, cfg = _block(torch.float32, E=64, K=2)
    g = torch.Generator().manual_seed(6)
    x0 = torch.randn(1, 6, 64, generator=g)
    gy = torch.randn(1, 6, 64, generator=g)
    ref = _run(blk, cfg, "eager", x0, gy)
    got = _run(blk, cfg, impl, x0, gy)
    assert int((got[3].abs().sum(dim=(1, 2)) == 0).sum()) >= 64 - 12  # at most 12 experts hit
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_unaligned_widths_fall_back_to_loop():
    """Widths whose rows are not 16-byte multiples cannot use _grouped_mm on the CPU."""
    blk, cfg = _block(torch.float32, E=8, K=2, H=30, inter=10)
    assert ex._resolve_segments("auto", blk.experts.gate_up_proj, blk.experts.down_proj) == "loop"
    g = torch.Generator().manual_seed(7)
    x0 = torch.randn(1, 12, 30, generator=g)
    gy = torch.randn(1, 12, 30, generator=g)
    ref = _run(blk, cfg, "eager", x0, gy)
    got = _run(blk, cfg, ex.NAME, x0, gy)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
