"""Device graphs equal the stock transformers modules (CPU), and their host-built inputs."""

from __future__ import annotations

import pytest
import torch
from npu_lora.device.graphs import causal_mask, label_gather
from npu_lora.models import preset_config
from npu_lora.rngd.catalogue import device_graphs
from transformers.masking_utils import create_causal_mask


def _flat(out):
    return list(out) if isinstance(out, tuple | list) else [out]


@pytest.mark.parametrize(
    "graph", device_graphs("tiny", seq_len=32, buckets=(8, 32)), ids=lambda g: g.name
)
def test_device_graph_equals_stock(graph):
    names = {"embed", "attention", "head", "hot_experts_b8", "hot_experts_b32"}
    assert graph.name in names and graph.reference is not None
    assert all(t.dtype != torch.int64 for t in graph.example_inputs)  # int32 on the device
    ins = [
        t.clone().requires_grad_(i in graph.grad_inputs) for i, t in enumerate(graph.example_inputs)
    ]
    refs = [
        t.clone().requires_grad_(i in graph.grad_inputs) for i, t in enumerate(graph.example_inputs)
    ]
    out = _flat(graph.module(*ins))
    ref = _flat(graph.reference(*refs))
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if graph.grad_inputs:
        sum(o.float().sum() * (k + 1) for k, o in enumerate(out)).backward()
        sum(o.float().sum() * (k + 1) for k, o in enumerate(ref)).backward()
        for i in graph.grad_inputs:
            torch.testing.assert_close(ins[i].grad, refs[i].grad, rtol=1e-5, atol=1e-6)


def test_causal_mask_equals_transformers():
    cfg = preset_config("tiny-qwen3-moe")
    cfg._attn_implementation = "eager"
    am = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    ref = create_causal_mask(
        config=cfg,
        inputs_embeds=torch.zeros(3, 5, 8),
        attention_mask=am,
        cache=None,
        position_ids=torch.arange(5)[None],
    )
    assert torch.equal(causal_mask(am, 3, 5, torch.float32), ref)


def test_label_gather_shift_and_padding():
    labels = torch.tensor([[-100, -100, 7, 8, -100], [-100, 3, -100, -100, 9]])
    lg = label_gather(labels, torch.float32)
    # logits at t predict labels[t+1]: row 0 positions 1, 2; row 1 positions 0, 3
    assert lg.count == 4 and lg.sel_BNS.shape == (2, 2, 5)
    assert lg.sel_BNS[0].nonzero().tolist() == [[0, 1], [1, 2]]
    assert lg.sel_BNS[1].nonzero().tolist() == [[0, 0], [1, 3]]
    assert lg.labels_BN.tolist() == [[7, 8], [3, 9]] and lg.labels_BN.dtype == torch.int32
    assert torch.allclose(lg.w_BN, torch.full((2, 2), 0.25))
    lg8 = label_gather(labels, torch.float32, n_bucket=4)
    assert lg8.sel_BNS.shape == (2, 4, 5) and lg8.w_BN[:, 2:].eq(0).all()


def test_headwise_v_proj_keeps_the_base_dtype_as_peft_does():
    """bf16 base with an fp32 LoRA adapter (peft's default upcast): the per-head projection
    returns the base layer's dtype and peft's values (a bf16 ``device.dtype`` run with
    ``v_proj`` in the targets once failed in attention with "expected scalar type Float")."""
    from npu_lora.device.graphs import headwise_linear
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False)).to(torch.bfloat16)
    peft_net = get_peft_model(net, LoraConfig(r=4, target_modules=["0"], lora_dropout=0.0))
    lin = peft_net.base_model.model[0]
    assert lin.lora_A["default"].weight.dtype == torch.float32  # the adapter is upcast
    with torch.no_grad():
        lin.lora_B["default"].weight.normal_(0.0, 0.1)
    x_BSD = torch.randn(2, 5, 64).to(torch.bfloat16)
    y_BKSd = headwise_linear(lin, x_BSD, d=8)
    ref_BKSd = lin(x_BSD).view(2, 5, 4, 8).transpose(1, 2)
    assert ref_BKSd.dtype == torch.bfloat16
    assert y_BKSd.dtype == ref_BKSd.dtype
    torch.testing.assert_close(y_BKSd, ref_BKSd, rtol=2e-2, atol=2e-2)


def test_bf16_device_dtype_trains_with_lora_on_v_proj(tiny):
    from npu_lora.engine import build_engine

    eng = build_engine(
        tiny.spec(device={"dtype": "bfloat16"}, lora={"targetModules": ["q_proj", "v_proj"]})
    )
    prof = eng.forward_backward(tiny.batch())
    assert torch.isfinite(torch.tensor(prof.loss))
