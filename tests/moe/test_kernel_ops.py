"""The extension's entry points are torch operators (``torch.ops.npu_lora.*``): the profiler
names them, ``torch.compile`` traces them without a graph break, and their fake (meta) shapes
match the real outputs."""

from __future__ import annotations

import pytest
import torch
from npu_lora.moe import kernels, stream, stream_linear
from npu_lora.moe.experts import build_routing
from npu_lora.moe.kernels import ops

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="extension unavailable")

T, K, E, H, INTER = 12, 2, 4, 64, 32


def _args() -> tuple:
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    r = build_routing(idx, E)
    gu = torch.randn(E, 2 * INTER, H, generator=g) * 0.1
    dn = torch.randn(E, H, INTER, generator=g) * 0.1
    x = torch.randn(T, H, generator=g)
    wr = torch.rand(T * K, generator=g)
    isa = kernels.ISA_CODES[kernels.isa()]
    return (x, r.token_idx, wr, stream._offsets(r), gu, dn, r.inv_perm, T, K, isa, 16, 32)


def test_the_ops_are_registered_under_the_npu_lora_namespace():
    for name in ("stream_forward", "stream_backward", "dense_forward", "dense_backward"):
        assert hasattr(torch.ops.npu_lora, name), name


def test_the_operators_equal_the_extension_calls_and_their_fake_shapes():
    args = _args()
    out, h = torch.ops.npu_lora.stream_forward(*args)
    ref_out, ref_h = kernels.load().forward(*args)
    assert torch.equal(out, ref_out) and torch.equal(h, ref_h)
    x, tok, wr, offs, gu, dn, inv, *_ = args
    gy = torch.randn(T, H)
    bw = (gy, tok, h, wr, offs, gu, dn, inv, T, K, args[9], 48, 40)
    got = torch.ops.npu_lora.stream_backward(*bw)
    for a, b in zip(got, kernels.load().backward(*bw), strict=True):
        assert torch.equal(a, b)
    torch.library.opcheck(ops.stream_forward, args, test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(ops.stream_backward, bw, test_utils=("test_schema", "test_faketensor"))
    w = torch.randn(48, H)
    for op, a in (
        (ops.dense_forward, (x, w, args[9], 16)),
        (ops.dense_backward, (gy[:, :48].contiguous(), w, args[9], 16)),
    ):
        torch.library.opcheck(op, a, test_utils=("test_schema", "test_faketensor"))


def test_the_profiler_names_the_kernel_ops():
    x = torch.randn(4, H, requires_grad=True)
    w = torch.randn(48, H)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        stream_linear.StreamLinearFunction.apply(x, w).sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert {"npu_lora::dense_forward", "npu_lora::dense_backward"} <= names, sorted(names)


def test_torch_compile_traces_the_op_without_a_graph_break():
    args = _args()
    breaks: list = []

    def fn(x):
        out, h = torch.ops.npu_lora.stream_forward(x, *args[1:])
        return out * 2 + h.sum()

    from torch._dynamo.utils import counters

    counters.clear()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(args[0]), fn(args[0]))
    breaks = [k for k in counters["graph_break"]]
    assert not breaks
