"""Compile-friendly formulations (npu_lora.device.ops, re-exported by npu_lora.rngd.formulations)
equal the stock ops on CPU, and remove the ops the tracer flags; graphs.py's attention and head,
which use them, equal the stock modules."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from npu_lora.rngd.formulations import (  # noqa: E402
    cross_entropy_int32,
    register_rngd_attention,
    softmax_rngd,
)
from npu_lora.rngd.inventory import capture, inventory  # noqa: E402

HAVE_GRAPHS = importlib.util.find_spec("npu_lora.device.graphs") is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_rngd_matches_stock_forward_and_backward(dtype):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 3, 16, 16, generator=gen) * 4).to(dtype)
    mask = torch.full((16, 16), torch.finfo(dtype).min).triu(1).to(dtype)
    g = torch.randn(2, 3, 16, 16, generator=gen)

    x1 = (x + mask).detach().requires_grad_()
    y1 = torch.softmax(x1, dim=-1, dtype=torch.float32)
    (gx1,) = torch.autograd.grad(y1, x1, g)
    x2 = (x + mask).detach().requires_grad_()
    y2 = softmax_rngd(x2, dim=-1, dtype=torch.float32)
    (gx2,) = torch.autograd.grad(y2, x2, g)

    assert torch.equal(y1, y2)  # same forward kernel
    assert gx2.dtype == gx1.dtype == dtype
    torch.testing.assert_close(gx2.float(), gx1.float(), atol=1e-6, rtol=1e-5)


def test_softmax_rngd_backward_has_no_softmax_backward_data():
    class Stock(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=-1, dtype=torch.float32)

    class Rngd(torch.nn.Module):
        def forward(self, x):
            return softmax_rngd(x, dim=-1, dtype=torch.float32)

    x = torch.randn(2, 8, 8, dtype=torch.bfloat16)
    stock = inventory(SimpleNamespace(name="s", module=Stock(), example_inputs=(x,), trainable=[0]))
    rngd = inventory(SimpleNamespace(name="r", module=Rngd(), example_inputs=(x,), trainable=[0]))
    assert "aten._softmax_backward_data.default" in stock["backward"].ops
    assert not stock["backward"].ok
    assert "aten._softmax_backward_data.default" not in rngd["backward"].ops
    assert rngd["forward"].ok and rngd["backward"].ok, rngd["backward"].summary()


def test_cross_entropy_int32_matches_stock():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3, 5, 50, generator=gen)
    labels = torch.randint(0, 50, (3, 5), generator=gen)
    ce = cross_entropy_int32(z, labels.to(torch.int32))
    ref = torch.nn.functional.cross_entropy(z.reshape(-1, 50), labels.reshape(-1), reduction="none")
    torch.testing.assert_close(ce.reshape(-1), ref)
    w = torch.full((3, 5), 1 / 15)
    torch.testing.assert_close(
        cross_entropy_int32(z, labels.to(torch.int32), w),
        torch.nn.functional.cross_entropy(z.reshape(-1, 50), labels.reshape(-1)),
    )


@pytest.mark.skipif(not HAVE_GRAPHS, reason="npu_lora/device/graphs.py does not exist yet")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_graph_matches_stock_attention(standins, dtype):
    """graphs.py's attention block (written out: softmax_rngd, v per head) passes the inventory
    where the stock module with eager attention fails it (fp32 _softmax_backward_data), and
    computes the same outputs (bitwise) and gradients."""
    from npu_lora.rngd.catalogue import device_graphs

    rngd = next(g for g in device_graphs("tiny", 32, dtype=dtype) if g.name == "attention")
    stock = next(
        g for g in standins.graphs_with_stock_ops("tiny", 32, dtype=dtype)
        if g.name == "attention_stock"
    )  # fmt: skip
    assert not inventory(stock)["backward"].ok
    invs = inventory(rngd)
    assert invs["forward"].ok and invs["backward"].ok, invs["backward"].summary()

    a, b = capture(stock, mode="eager"), capture(rngd, mode="eager")
    names = {w: w.replace("param block.", "param ") for w in a.wrt}  # AttentionStock.block
    assert list(names.values()) == b.wrt
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    for x, y in zip(a.outputs, b.outputs, strict=True):
        assert torch.equal(x, y)
    for w in a.wrt:
        torch.testing.assert_close(b.grads[names[w]], a.grads[w], **tol, msg=w)


@pytest.mark.skipif(not HAVE_GRAPHS, reason="npu_lora/device/graphs.py does not exist yet")
def test_registered_rngd_attention_matches_eager(standins):
    """The stock module with ``rngd_eager`` (formulations.register_rngd_attention) computes what
    eager does and traces no _softmax_backward_data."""
    stock = next(
        g for g in standins.graphs_with_stock_ops("tiny", 32) if g.name == "attention_stock"
    )  # fmt: skip
    a = capture(stock, mode="eager")
    attn = stock.module.block.self_attn
    attn.config._attn_implementation = register_rngd_attention()
    try:
        b = capture(stock, mode="eager")
        inv = inventory(stock)["backward"]
    finally:
        attn.config._attn_implementation = "eager"
    assert "aten._softmax_backward_data.default" not in inv.ops
    for x, y in zip(a.outputs, b.outputs, strict=True):
        assert torch.equal(x, y)
    for w in a.wrt:
        torch.testing.assert_close(b.grads[w], a.grads[w], atol=1e-5, rtol=1e-5, msg=w)


def test_logsumexp_rngd_matches_stock():
    from npu_lora.rngd.formulations import logsumexp_rngd

    gen = torch.Generator().manual_seed(0)
    z = (torch.randn(3, 7, 50, generator=gen) * 10).requires_grad_()
    g = torch.randn(3, 7, generator=gen)
    a, b = torch.logsumexp(z, -1), logsumexp_rngd(z, -1)
    torch.testing.assert_close(b, a)
    torch.testing.assert_close(logsumexp_rngd(z, 1, keepdim=True), torch.logsumexp(z, 1, True))
    (ga,) = torch.autograd.grad(a, z, g)
    (gb,) = torch.autograd.grad(b, z, g)
    torch.testing.assert_close(gb, ga)


@pytest.mark.skipif(not HAVE_GRAPHS, reason="npu_lora/device/graphs.py does not exist yet")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_with_rngd_logsumexp_passes_and_matches(standins, dtype):
    """graphs.py's head (logsumexp written out) computes the same loss and input gradients as
    with torch.logsumexp, and does not trace aten.logsumexp."""
    from npu_lora.rngd.catalogue import device_graphs

    rngd = next(g for g in device_graphs("tiny", 32, dtype=dtype) if g.name == "head")
    stock = next(
        g for g in standins.graphs_with_stock_ops("tiny", 32, dtype=dtype)
        if g.name == "head_stock"
    )  # fmt: skip
    assert "aten.logsumexp.default" in inventory(stock)["forward"].ops
    invs = inventory(rngd)
    assert invs["forward"].ok and invs["backward"].ok, invs["forward"].summary()
    assert "aten.logsumexp.default" not in invs["forward"].ops

    a, b = capture(stock, mode="eager"), capture(rngd, mode="eager")
    torch.testing.assert_close(b.outputs[0], a.outputs[0], atol=1e-5, rtol=1e-5)
    for w in a.wrt:
        torch.testing.assert_close(b.grads[w], a.grads[w], atol=1e-5, rtol=1e-4, msg=w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_half_matrix_is_bitwise_rotate_half(dtype):
    """``x @ rotate_half_matrix(d)`` == transformers' ``rotate_half(x)``, bit for bit, and its
    gradient is the rotation's transpose applied to the cotangent (exact)."""
    from npu_lora.device.graphs import rotate_half_matrix
    from transformers.models.qwen3_moe.modeling_qwen3_moe import rotate_half

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 32, 128, generator=g).to(dtype).requires_grad_(True)
    R = rotate_half_matrix(128, dtype)
    y = torch.matmul(x, R)
    assert torch.equal(y, rotate_half(x.detach()))
    gy = torch.randn(y.shape, generator=g).to(dtype)
    y.backward(gy)
    x2 = x.detach().clone().requires_grad_(True)
    rotate_half(x2).backward(gy)
    assert torch.equal(x.grad, x2.grad)
