"""8-bit frozen experts (``moe.hostDtype: int8 | float8_e4m3fn``): the formats, the stream
kernel's 8-bit drivers on every instance this CPU runs (forced with the ISA switch) against
"dequantise to fp32, then matmul", on random and adversarial scales, and the module path."""

from __future__ import annotations

import math

import pytest
import torch
from npu_lora.models import quant
from npu_lora.moe import kernels, stream
from npu_lora.moe.routing import build_routing
from npu_lora.moe.stream_q8 import _torch_backward, _torch_forward, stream_q8_experts

from .moe_blocks import stock_block

ISAS = kernels.cpu_isas()
FMTS = [quant.INT8, quant.FP8]
#: relative to each tensor's max |value|: fp32 operands and accumulation, only the summation
#: order differs from the reference
TOL = 2e-5


def _cpu_has_vbmi() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return "avx512vbmi" in f.read().split()
    except OSError:
        return False


#: the bf16-operand instance (AVX512-BF16 with VBMI, for its e4m3 byte tables; AMX hosts run it
#: too) for bf16 activations; Cooper Lake (BF16 without VBMI) runs the avx512 instance
NATIVE = [i for i in ISAS if i in kernels.NATIVE_ISAS] if _cpu_has_vbmi() else []
#: bf16-operand instance against an emulation of its contract (x and the gradient bf16 values,
#: act = bf16(SiLU(gate)·up), the dX coefficients rounded to bf16 after a per-row scale is folded
#: in): fp32 summation order, plus room for one bf16 rounding of an activation landing on the
#: other side of a tie (the kernel's SiLU and torch's differ in the last fp32 bit)
TOL_NATIVE = 1e-3
#: ... and against "dequantise to fp32, then matmul" on the bf16-rounded activations: bf16
#: rounding (2^-9 relative) of act and of the dX coefficients, two in a chain for dx
TOL_NATIVE_FP32 = 2**-7


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _problem(fmt: str, *, E=5, H=160, inter=80, T=13, K=2, seed=0, adversarial=False, block=None):
    g = torch.Generator().manual_seed(seed)
    gu = torch.randn(E, 2 * inter, H, generator=g) * 0.05
    dn = torch.randn(E, H, inter, generator=g) * 0.05
    fm = quant.FORMATS[fmt]
    if block is not None:  # another block layout of the same format
        fm = quant.Format(fm.name, fm.dtype, block, fm.qmax)
    q_gu, s_gu = quant.quantize(gu, fm)
    q_dn, s_dn = quant.quantize(dn, fm)
    if adversarial:
        for q, s in ((q_gu, s_gu), (q_dn, s_dn)):
            # scales over many decades (incl. fp32-subnormal-free tiny and large ones)
            f = torch.logspace(-6, 6, s.numel())[torch.randperm(s.numel(), generator=g)]
            s.mul_(f.view_as(s))
            if fmt == quant.FP8:
                qb = q.view(torch.uint8)
                qb[0, :128, :128] = 0  # a block of zeros
                s[0, 0, 0] = 0.0  # ... and a zero scale
                qb[1, :128, :128] = 0x7E  # a block of max e4m3 (448)
                qb[1, :64, :64] = 0xFE  # (-448)
                qb[2] = torch.randint(0, 8, qb[2].shape, generator=g, dtype=torch.uint8) | (
                    torch.randint(0, 2, qb[2].shape, generator=g, dtype=torch.uint8) << 7
                )  # subnormals (exponent 0), both signs
            else:
                q[0, :5] = 0
                s[0, :5] = 0.0
                q[1] = 127
                q[1, ::2] = -127
    x = torch.randn(T, H, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    gy = torch.randn(T, H, generator=g)
    return (q_gu, s_gu, q_dn, s_dn), fm.block, x, idx, w, gy


def _reference(q, block, x, idx, w, gy):
    r = build_routing(idx, q[0].shape[0])
    w_g = w.reshape(-1)[r.perm].float().contiguous()
    x_g = x.float()[r.token_idx].contiguous()
    out, h = _torch_forward(x_g, w_g, r, q, block)
    g_g = gy.float()[r.token_idx].contiguous()
    dx, dw, dh = _torch_backward(g_g, h, w_g, r, q, block)
    return r, w_g, out, h, dx, dw, dh


def _axpy_contract(coef, q, s, block, expert_of):
    """sum_r coef[s, r] * W[e(s), r, :] as the bf16-operand kernel defines it, in float64: one
    block per row: bf16(coef * the row's scale) times the 8-bit values; column blocks: bf16(coef)
    times the dequantised weights (the scale applied to fp32 partial sums)."""
    R, C = q.shape[1:]
    br, bc = block
    qe = q[expert_of]
    if bc <= 0 or bc >= C:
        srow = s[:, :, 0].repeat_interleave(max(br, 1), dim=1)[:, :R]
        cq = (coef.float() * srow[expert_of]).bfloat16().double()
        vals = quant.dequantize(qe, torch.ones_like(s[expert_of]), block).double()
    else:
        cq = coef.float().bfloat16().double()
        vals = quant.dequantize(qe, s[expert_of], block).double()
    return torch.einsum("sr,src->sc", cq, vals)


def _native_contract(q, block, r, w_g, x, gy, h, T):
    """The bf16-operand kernel's results as its contract defines them (float64), with the
    kernel's own pre-activations ``h`` for the activations' rounding."""
    E = q[0].shape[0]
    offs = stream._offsets(r).long()
    expert_of = torch.repeat_interleave(torch.arange(E), offs.diff())
    S = int(offs[-1])
    tok = r.token_idx[:S]
    xs = x[tok].double()  # bf16 values
    gu = quant.dequantize(q[0], q[1], block).double()
    dn = quant.dequantize(q[2], q[3], block).double()
    inter = q[2].shape[2]
    h_ref = torch.einsum("sc,src->sr", xs, gu[expert_of])
    hk = h[:S]
    act = (torch.nn.functional.silu(hk[:, :inter]) * hk[:, inter:]).bfloat16().double()
    y = torch.einsum("si,sdi->sd", act, dn[expert_of]) * w_g[:S, None].double()
    out = torch.zeros(T, x.shape[1], dtype=torch.float64).index_add_(0, tok, y)
    z = _axpy_contract(gy[tok].float(), q[2], q[3], block, expert_of)
    gt, u = hk[:, :inter].double(), hk[:, inter:].double()
    sg = torch.sigmoid(gt)
    silu = gt * sg
    dw = (silu * u * z).sum(1)
    da = z * w_g[:S, None].double()
    dh = torch.cat([da * u * (sg * (1 + gt * (1 - sg))), da * silu], 1)
    dxs = _axpy_contract(dh.float(), q[0], q[1], block, expert_of)
    dx = torch.zeros(T, x.shape[1], dtype=torch.float64).index_add_(0, tok, dxs)
    return out, h_ref, dx, dw, dh


def _kernel(isa, q, block, r, w_g, x, gy, T, K):
    mod = kernels.load()
    offs = stream._offsets(r)
    code = kernels.ISA_CODES[isa]
    out, h = mod.q8_forward(
        x, r.token_idx, w_g, offs, *q, r.inv_perm, T, K, block[0], block[1], code,
        stream.GU_BLOCK, stream.DOWN_BLOCK,
    )  # fmt: skip
    dx, dw, dh = mod.q8_backward(
        gy, r.token_idx, h, w_g, offs, *q, r.inv_perm, T, K, block[0], block[1], code,
        -(-q[2].shape[1] // 2), -(-q[0].shape[1] // 2),
    )  # fmt: skip
    return out, h, dx, dw, dh


def test_extension_has_q8():
    mod = kernels.load()
    assert mod is not None, kernels.error()
    assert mod.q8_instance(kernels.ISA_CODES["base"]) == "base"
    if "avx512" in ISAS:
        assert mod.q8_instance(kernels.ISA_CODES["avx512"]) == "avx512"
    for isa in NATIVE:  # bf16 operands for bf16 activations (fp32 ones: the avx512 kernels)
        assert mod.q8_instance(kernels.ISA_CODES[isa]) == "avx512bf16"
    for isa in set(ISAS) & set(kernels.NATIVE_ISAS) - set(NATIVE):  # BF16 without VBMI
        assert mod.q8_instance(kernels.ISA_CODES[isa]) == "avx512"


@pytest.mark.parametrize("fmt", FMTS)
def test_quantize_error_bound(fmt):
    w = torch.randn(3, 200, 300) * 0.02
    q, s = quant.quantize(w, fmt)
    assert q.dtype == quant.FORMATS[fmt].dtype
    assert s.shape == quant.scale_shape(w.shape, quant.FORMATS[fmt].block)
    d = quant.dequantize(q, s, quant.FORMATS[fmt].block)
    full = quant._expand(s, 200, 300, quant.FORMATS[fmt].block)
    if fmt == quant.INT8:  # half a step of the row's scale
        assert bool(((d - w).abs() <= full * 0.5001 + 1e-12).all())
    else:  # e4m3: 3 mantissa bits, relative 2^-4 for normals, subnormal step 2^-9 of the scale
        assert bool(((d - w).abs() <= torch.maximum(w.abs() / 16, full * 2**-10) + 1e-12).all())
    mod = kernels.load()
    if mod is not None:  # the extension's dequantisation is the same numbers
        blk = quant.FORMATS[fmt].block
        assert torch.equal(mod.q8_dequantize(q, s, blk[0], blk[1], False), d)


@pytest.mark.parametrize("adversarial", [False, True], ids=["random", "adversarial"])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("isa", ISAS)
def test_kernel_matches_dequantised_fp32(isa, fmt, adversarial):
    """Forward (out, h) and input gradient (dx, dw, dh) of every instance against dequantise +
    fp32 matmul; shapes with column tails past the 128-blocks and vector widths."""
    T, K = 13, 2
    q, block, x, idx, w, gy = _problem(fmt, T=T, K=K, adversarial=adversarial)
    r, w_g, *ref = _reference(q, block, x, idx, w, gy)
    got = _kernel(isa, q, block, r, w_g, x, gy, T, K)
    for name, a, b in zip(("out", "h", "dx", "dw", "dh"), got, ref, strict=True):
        assert torch.isfinite(a).all(), name
        assert _rel(a, b) < TOL, (name, _rel(a, b))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("isa", ISAS)
def test_kernel_bf16_hidden_and_threads_deterministic(isa, fmt):
    """bf16 activations: bitwise the same on 1 and 2 threads; the widening instances give the
    fp32 result on the bf16 values, the bf16-operand one its contract."""
    T, K = 40, 2
    q, block, x, idx, w, gy = _problem(fmt, T=T, K=K, E=6, H=256, inter=128, seed=3)
    xb, gb = x.bfloat16(), gy.bfloat16()
    r, w_g, *ref = _reference(q, block, xb.float(), idx, w, gb.float())
    prev = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(_kernel(isa, q, block, r, w_g, xb, gb, T, K))
    finally:
        torch.set_num_threads(prev)
    for a, b in zip(outs[0], outs[1], strict=True):
        assert torch.equal(a, b)
    if isa in NATIVE:
        ref = _native_contract(q, block, r, w_g, xb, gb, outs[0][1], T)
        for name, a, b in zip(("out", "h", "dx", "dw", "dh"), outs[0], ref, strict=True):
            err = _rel(a[: len(b)].double(), b)
            assert err < (TOL if name == "h" else TOL_NATIVE), (name, err)
    else:
        for a, b in zip(outs[0], ref, strict=True):
            assert _rel(a, b) < TOL


#: block layouts for the bf16-operand kernels: the formats' own (int8 per channel; FP8 128 x 128,
#: whose down_proj rows here are shorter than a block: one block per row), per-channel FP8,
#: 32 x 32 FP8 blocks (the tiny checkpoints'), and 16 x 16 (not a multiple of 32: the fp32
#: kernels run instead)
NATIVE_CASES = [
    (quant.INT8, None),
    (quant.FP8, None),
    (quant.FP8, (1, 0)),
    (quant.FP8, (32, 32)),
    (quant.FP8, (16, 16)),
]


@pytest.mark.skipif(not NATIVE, reason="no AVX512-BF16 on this CPU")
@pytest.mark.parametrize("adversarial", [False, True], ids=["random", "adversarial"])
@pytest.mark.parametrize(("fmt", "block"), NATIVE_CASES, ids=lambda v: str(v))
def test_native_kernel_bf16_error_bounds(fmt, block, adversarial):
    """The bf16-operand kernels (bf16 activations on AVX512-BF16): within TOL_NATIVE of their
    contract and within TOL_NATIVE_FP32 of "dequantise to fp32, then matmul" on the bf16-rounded
    activations; pre-activations h (exact products, fp32 sums) within TOL. Shapes with column
    tails, odd row groups, several token tiles (an expert with > 16 tokens)."""
    T, K = 45, 2
    q, blk, x, idx, w, gy = _problem(
        fmt, T=T, K=K, E=4, H=160, inter=80, seed=7, adversarial=adversarial, block=block
    )
    xb, gb = x.bfloat16(), gy.bfloat16()
    r, w_g, *ref = _reference(q, blk, xb.float(), idx, w, gb.float())
    got = _kernel(NATIVE[0], q, blk, r, w_g, xb, gb, T, K)
    names = ("out", "h", "dx", "dw", "dh")
    for name, a in zip(names, got, strict=True):
        assert torch.isfinite(a).all(), name
    if blk == (16, 16):  # the fp32 kernels: the fp32 result on the bf16 values
        for name, a, b in zip(names, got, ref, strict=True):
            assert _rel(a, b) < TOL, (name, _rel(a, b))
        return
    con = _native_contract(q, blk, r, w_g, xb, gb, got[1], T)
    S = len(con[3])
    for name, a, b, c in zip(names, got, ref, con, strict=True):
        a = a[:S] if name in ("dw", "dh") else a
        b = b[:S] if name in ("dw", "dh") else b
        tol = TOL if name == "h" else TOL_NATIVE
        assert _rel(a.double(), c) < tol, (name, "contract", _rel(a.double(), c))
        assert _rel(a, b) < (TOL if name == "h" else TOL_NATIVE_FP32), (name, "fp32", _rel(a, b))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("path", ["cpp", "torch"])
def test_module_path_against_bf16_block(fmt, path, monkeypatch):
    """A stock block whose experts are quantised runs through the stream kernel's 8-bit path
    (and its torch fallback): gradients reach the input and the router, none the frozen experts;
    output within the quantisation error of the unquantised block."""
    if path == "torch":
        monkeypatch.setattr(kernels, "isa", lambda: None)
    stream.register()
    blk, cfg = stock_block(torch.float32, E=8, K=2, H=128, inter=64)
    x0 = torch.randn(2, 9, 128)
    gy = torch.randn(2, 9, 128)
    cfg._experts_implementation = "npu_lora_stream"
    x = x0.clone().requires_grad_(True)
    y_ref = blk(x)
    y_ref.backward(gy)
    dx_ref = x.grad
    quant.quantize_experts(blk.experts, fmt)
    assert quant.is_quantized(blk.experts)
    assert blk.experts.gate_up_proj.dtype == quant.FORMATS[fmt].dtype
    assert not blk.experts.gate_up_proj.requires_grad
    x = x0.clone().requires_grad_(True)
    blk.zero_grad(set_to_none=True)
    y = blk(x)
    y.backward(gy)
    assert blk.gate.weight.grad is not None
    tol = 0.02 if fmt == quant.INT8 else 0.08
    assert _rel(y.detach(), y_ref.detach()) < tol
    assert _rel(x.grad, dx_ref) < tol


def test_functional_matches_fallback(monkeypatch):
    q, block, x, idx, w, gy = _problem(quant.FP8, T=20, K=2, seed=5)

    class _E(torch.nn.Module):
        pass

    e = _E()
    quant.set_quantized(e, "gate_up_proj", q[0], q[1], block)
    quant.set_quantized(e, "down_proj", q[2], q[3], block)
    outs = []
    for fallback in (False, True):
        if fallback:
            monkeypatch.setattr(kernels, "isa", lambda: None)
        xx = x.clone().requires_grad_(True)
        ww = w.clone().requires_grad_(True)
        y = stream_q8_experts(xx, idx, ww, e)
        y.backward(gy)
        outs.append((y.detach(), xx.grad, ww.grad))
    for a, b in zip(*outs, strict=True):
        assert _rel(a, b) < TOL


@pytest.mark.skipif(kernels.load() is None, reason="extension unavailable")
def test_roofline_sweep_counts_8bit_bytes_as_held(tmp_path):
    """``npu-lora bench --roofline-dtypes bfloat16,int8,float8_e4m3fn``: the 8-bit rows count 1
    byte a weight plus the fp32 scales (the hit experts' bytes, as held), bf16 2 bytes."""
    from npu_lora.bench.roofline import run_roofline

    H, inter, E = 128, 64, 8
    res = run_roofline(
        out=tmp_path, tokens=(16,), dtypes=("bfloat16", "int8", "float8_e4m3fn"), rounds=1,
        H=H, inter=inter, E=E, K=2, log=lambda s: None, save_machine=False, peak_n=128,
    )  # fmt: skip
    rows = {r["dtype"]: r for r in res["rows"]}
    w = 3 * H * inter
    scales = {"int8": 2 * inter + H, "float8_e4m3fn": 1 + 1}  # per expert: rows; 128-blocks
    assert rows["bfloat16"]["bytes"] == rows["bfloat16"]["hit"] * 2 * w
    for d in ("int8", "float8_e4m3fn"):
        assert rows[d]["bytes"] == rows[d]["hit"] * (w + 4 * scales[d])
        assert math.isfinite(rows[d]["fwd_s"]) and rows[d]["bound"] in ("bandwidth", "compute")
    assert set(res["machine"]["peak_gflops"]) == {"bfloat16", "int8", "float8_e4m3fn"}


def test_roofline_dtypes_option_refuses_other_names():
    import argparse

    from npu_lora.commands.bench import _roofline_dtypes

    assert _roofline_dtypes("bfloat16,int8") == "bfloat16,int8"
    with pytest.raises(argparse.ArgumentTypeError, match="int4"):
        _roofline_dtypes("bfloat16,int4")
