"""HostMLP: keep_graph vs recompute vs the stock block; graph lifetime; memory."""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from npu_lora.api.v1alpha1 import LoraSpec, ModelSpec
from npu_lora.backends import CpuBackend
from npu_lora.engine import build_engine
from npu_lora.models import build_model, moe_blocks
from npu_lora.moe import HostMLP


def _block_grads(mlp, x, g):
    x = x.detach().clone().requires_grad_(True)
    y = mlp(x)
    y.backward(g)
    return (
        y.detach(),
        x.grad,
        [p.grad.clone() for p in (mlp.experts.gate_up_proj, mlp.experts.down_proj)],
    )


@pytest.mark.parametrize("impl", ["grouped_mm", "eager", "npu_lora_stream"])
def test_host_mlp_keep_graph_equals_recompute(deterministic, impl):
    """Block-level: input grads AND full fine-tune expert grads bitwise equal between
    keep_graph, recompute and the unwrapped stock block."""
    from npu_lora.moe.experts import register

    register()
    model, _ = build_model(
        ModelSpec(preset="tiny-qwen3-moe"),
        LoraSpec(train_experts=True),
        seed=0,
        experts_implementation=impl,
    )
    stock = moe_blocks(model)[0]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 64, generator=g)
    gy = torch.randn(2, 16, 64, generator=g)
    results = {}
    for name in ("stock", "keep", "recompute"):
        block = copy.deepcopy(stock)
        mlp = (
            block
            if name == "stock"
            else HostMLP(block, layer=0, backend=CpuBackend(), keep_graph=name == "keep")
        )
        results[name] = _block_grads(mlp, x, gy)
        if name == "keep":
            assert mlp.reused == 1 and mlp.recomputed == 0 and mlp._kept is None
        if name == "recompute":
            assert mlp.reused == 0 and mlp.recomputed == 1
    for name in ("keep", "recompute"):
        y, gx, gw = results[name]
        assert torch.equal(y, results["stock"][0])
        assert torch.equal(gx, results["stock"][1])
        for a, b in zip(gw, results["stock"][2], strict=True):
            assert torch.equal(a, b)


def test_bf16_experts_with_fp32_router_and_activations():
    """``compute_dtype=float32`` with bf16 expert weights (what ``hostDtype`` bf16 resolves to on
    a CPU without native bf16): the router weight becomes fp32, the experts stay bf16, the block
    runs on fp32 activations (no torch bf16 matmul), keep_graph still equals recompute bitwise, and
    the result is as close to the fp32 reference of the same weights as the all-bf16 block."""
    from npu_lora.moe.experts import register

    register()
    model, _ = build_model(
        ModelSpec(preset="tiny-qwen3-moe"),
        LoraSpec(),
        seed=0,
        host_dtype="bfloat16",
        experts_implementation="npu_lora_stream",
    )
    stock16 = moe_blocks(model)[0]
    ref = copy.deepcopy(stock16).float()  # the fp32 reference of the same (bf16-valued) weights
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 64, generator=g)
    gy = torch.randn(2, 16, 64, generator=g)
    y_ref, gx_ref = _in_grads(ref, x, gy)
    out = {}
    for name, compute, keep in (
        ("bf16", None, True),
        ("keep", torch.float32, True),
        ("recompute", torch.float32, False),
    ):
        mlp = HostMLP(
            copy.deepcopy(stock16),
            layer=0,
            backend=CpuBackend(),
            keep_graph=keep,
            compute_dtype=compute,
        )
        if compute is not None:
            assert mlp.gate.weight.dtype == torch.float32
            assert mlp.experts.gate_up_proj.dtype == torch.bfloat16
        out[name] = _in_grads(mlp, x, gy)
    assert torch.equal(out["keep"][0], out["recompute"][0])
    assert torch.equal(out["keep"][1], out["recompute"][1])
    for i in range(2):
        err32 = (out["keep"][i] - y_ref if i == 0 else out["keep"][i] - gx_ref).abs().max()
        err16 = (out["bf16"][i] - (y_ref if i == 0 else gx_ref)).abs().max()
        assert err32 <= err16 + 1e-6, (i, float(err32), float(err16))


def _in_grads(mlp, x, g):
    x = x.detach().clone().requires_grad_(True)
    y = mlp(x)
    y.backward(g)
    return y.detach().float(), x.grad.float()


@pytest.mark.parametrize(
    "over",
    [
        {"lora": {"trainExperts": True}},
        {"moe": {"placement": "hot", "warmupSteps": 0}},
        {"moe": {"hostDtype": "bfloat16"}, "lora": {"trainExperts": True}},
    ],
    ids=["host-only+experts", "hot", "bf16+experts"],
)
def test_engine_lora_and_expert_grads_keep_vs_recompute(deterministic, tiny, over):
    """Whole model: LoRA (and expert) gradients bitwise equal with keep_graph on and off."""
    grads = {}
    for keep in (True, False):
        moe = {**over.get("moe", {}), "keepGraph": keep}
        eng = build_engine(tiny.spec(moe=moe, lora=over.get("lora", {})))
        tiny.randomize_lora(eng.model)
        eng.select_hot_experts(0)
        prof = eng.forward_backward(tiny.batch())
        assert prof.keep_graph is keep
        assert (prof.recompute_s > 0) is (not keep)
        grads[keep] = {n: p.grad.clone() for n, p in eng.adapter.named_parameters()}
    assert grads[True].keys() == grads[False].keys()
    assert any("lora_A" in n for n in grads[True])
    if over.get("lora", {}).get("trainExperts"):
        assert any("experts.down_proj" in n for n in grads[True])
    for n in grads[True]:
        assert torch.equal(grads[True][n], grads[False][n]), n


def test_abandoned_graph_is_replaced_and_recomputed(tiny):
    """Two forwards of a layer before one backward: the first backward recomputes (its graph
    was replaced), the slot never holds more than one graph, and gradients are still right."""
    eng = build_engine(tiny.spec())
    mlp = eng.mlps[0]
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(1, 8, 64, generator=g, requires_grad=True)
    x2 = torch.randn(1, 8, 64, generator=g, requires_grad=True)
    y1 = mlp(x1)
    kept1 = mlp._kept
    y2 = mlp(x2)
    assert mlp._kept is not kept1  # the first graph was dropped
    y1.sum().backward()  # not the kept one → recompute
    assert mlp.recomputed == 1 and mlp._kept is not None  # x2's graph still kept
    y2.sum().backward()
    assert mlp.reused == 1 and mlp._kept is None
    ref = copy.deepcopy(mlp._block)
    xr = x1.detach().clone().requires_grad_(True)
    ref(xr).sum().backward()
    torch.testing.assert_close(x1.grad, xr.grad, rtol=0, atol=1e-6)


def _live_tensors() -> int:
    gc.collect()
    n = 0
    for obj in gc.get_objects():
        try:
            if torch.is_tensor(obj):
                n += 1
        except Exception:
            continue
    return n


def test_keep_graph_memory_does_not_grow(tiny):
    """5 steps with keep_graph: no kept graph survives a step and the number of live tensors
    is the same after step 2 and step 5 (step 1 creates the optimizer state)."""
    eng = build_engine(tiny.spec(lora={"trainExperts": True}))
    opt = torch.optim.AdamW(eng.adapter.parameters(), lr=1e-3)
    batch = tiny.batch()
    counts = {}
    for step in range(1, 6):
        eng.forward_backward(batch)
        # backward itself consumed and freed every layer's kept graph (no recompute)
        assert all(m._kept is None and m.reused == step and m.recomputed == 0 for m in eng.mlps)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step in (2, 5):
            counts[step] = _live_tensors()
    assert counts[5] == counts[2], counts
