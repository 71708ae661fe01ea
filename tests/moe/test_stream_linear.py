"""``npu_lora.moe.stream_linear``: the streaming kernel for one frozen dense weight on a few rows
(the ``cpu`` backend's LM head), on every ISA path this CPU runs, against ``F.linear``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from npu_lora.moe import kernels, stream_linear

ISAS = kernels.cpu_isas()


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    monkeypatch.setenv("NPU_LORA_STREAM_ISA", request.param)
    return request.param


def _run(x, w, gy, fn):
    x = x.clone().requires_grad_(True)
    y = fn(x, w)
    y.backward(gy)
    return y.detach(), x.grad


def _operands(N, R, C, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(R, C, generator=g) * 0.05).to(dtype)
    x = torch.randn(2, N, C, generator=g).to(dtype)
    gy = torch.randn(2, N, R, generator=g).to(dtype)
    return x, w, gy


# R, C: rows not a multiple of the forward block or of 16/32 (tails), columns not a multiple of a
# vector or a tile; N per batch row 1..10, so 2..20 rows: one and two 16-row token blocks
@pytest.mark.parametrize(("N", "R", "C"), [(1, 37, 24), (4, 1000, 200), (10, 531, 520)])
def test_fp32_matches_torch_linear_incl_dx(isa, N, R, C):
    x, w, gy = _operands(N, R, C, torch.float32)
    got = _run(x, w, gy, stream_linear.StreamLinearFunction.apply)
    ref = _run(x, w, gy, F.linear)
    for name, a, b in zip(("y", "dx"), got, ref, strict=True):
        atol = 1e-5 * b.abs().max().item()  # sums of C (y) or R (dx) terms in another order
        torch.testing.assert_close(a, b, rtol=1e-5, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(("N", "R", "C"), [(3, 1000, 200), (10, 531, 520)])
def test_bf16_close_to_the_fp32_reference(isa, N, R, C):
    """bf16 operands, fp32 accumulation, the result rounded to bf16 (as torch's bf16 matmul): within
    1 % of the scale of the fp32 product of the same bf16 values."""
    x, w, gy = _operands(N, R, C, torch.bfloat16)
    y, dx = _run(x, w, gy, stream_linear.StreamLinearFunction.apply)
    assert y.dtype == dx.dtype == torch.bfloat16
    y_ref = x.float() @ w.float().T
    dx_ref = gy.float() @ w.float()
    for name, a, b in (("y", y, y_ref), ("dx", dx, dx_ref)):
        err = (a.float() - b).abs().max().item() / b.abs().max().item()
        assert err < 1e-2, (name, err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_results_are_bitwise_the_same_across_runs_and_threads(isa, dtype):
    x, w, gy = _operands(7, 3000, 264, dtype, seed=3)
    prev = torch.get_num_threads()
    out = []
    try:
        for threads in (1, 2, 2):
            torch.set_num_threads(threads)
            out.append(_run(x, w, gy, stream_linear.StreamLinearFunction.apply))
    finally:
        torch.set_num_threads(prev)
    for a, b in zip(out[0], out[1], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(out[1], out[2], strict=True):
        assert torch.equal(a, b)


def test_frozen_linear_takes_the_kernel_only_where_it_applies(monkeypatch):
    x, w, _ = _operands(3, 200, 64, torch.float32)
    assert stream_linear.usable(x, w)
    y = stream_linear.frozen_linear(x.requires_grad_(True), w)
    assert type(y.grad_fn).__name__ == "StreamLinearFunctionBackward"
    many = torch.randn(1, stream_linear.MAX_ROWS + 1, 64)
    trainable = w.clone().requires_grad_(True)
    cases = {
        "more rows than MAX_ROWS": (many, w),
        "trainable weight": (x, trainable),
        "transposed weight": (torch.randn(3, 200), w.T),
    }
    for why, (a, b) in cases.items():
        assert not stream_linear.usable(a, b), why
        assert torch.equal(stream_linear.frozen_linear(a, b), F.linear(a, b)), why
    assert not stream_linear.usable(x.bfloat16(), w)  # dtypes differ (F.linear refuses it too)
    monkeypatch.setenv("NPU_LORA_STREAM_HEAD", "0")
    assert not stream_linear.usable(x, w)


def test_extension_checks_the_operands():
    mod = kernels.load()
    code = kernels.ISA_CODES["base"]
    with pytest.raises(RuntimeError, match="x columns != weight columns"):
        mod.dense_forward(torch.zeros(2, 5), torch.zeros(7, 6), code, 4)
    with pytest.raises(RuntimeError, match="grad_out columns != weight rows"):
        mod.dense_backward(torch.zeros(2, 6), torch.zeros(7, 6), code, 4)
    with pytest.raises(RuntimeError, match="block must be positive"):
        mod.dense_forward(torch.zeros(2, 6), torch.zeros(7, 6), code, 0)
