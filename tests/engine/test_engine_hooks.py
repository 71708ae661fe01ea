"""The engine's one seam for the bench's strategies (``EngineHooks``) and the owners it composes."""

from __future__ import annotations

import torch
from npu_lora.engine import DefaultHooks, HotPath, build_engine


class Recording(DefaultHooks):
    """The engine's own way, recording what the engine asked; the head on ``lm_head``."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def first_moe_input(self, backend, shape_BSD, dtype):
        self.asked.append("first_moe_input")
        return super().first_moe_input(backend, shape_BSD, dtype)

    def head_linear(self, backend):
        self.asked.append("head_linear")
        return None

    def hot_path(self):
        self.asked.append("hot_path")
        return HotPath(capacity="max")


def test_hooks_given_to_build_engine_are_asked_every_micro_batch(tiny):
    hooks = Recording()
    spec = tiny.spec(moe={"placement": "hot", "warmupSteps": 0})
    eng = build_engine(spec, hooks=hooks)
    assert eng.hooks is hooks and eng.head.linear is None  # the head built with its answer
    eng.select_hot_experts(0)
    hooks.asked.clear()
    prof = eng.forward_backward(tiny.batch())
    assert sorted(set(hooks.asked)) == ["first_moe_input", "head_linear", "hot_path"]
    assert prof.hot_experts > 0 and all(m.hot.capacity == "max" for m in eng.mlps)
    eng.use_hooks(DefaultHooks())  # back to the engine's own way from the next micro-batch
    eng.forward_backward(tiny.batch())
    assert all(m.hot.capacity == "cost" for m in eng.mlps) and eng.head.linear is not None


def test_shared_expert_weights_are_the_engines_own_from_then_on(tiny):
    """``share_expert_weights`` (the data-parallel ranks of a pod): the engine computes with
    the given tensors, and the default hooks never point it back."""
    eng = build_engine(tiny.spec())
    copies = [(gu.clone(), dn.clone()) for gu, dn in eng.expert_weights()]
    before = eng.forward_backward(tiny.batch()).loss
    eng.share_expert_weights(copies)
    assert [gu.data_ptr() for gu, _ in eng.expert_weights()] == [gu.data_ptr() for gu, _ in copies]
    assert eng.forward_backward(tiny.batch()).loss == before
    assert eng.expert_weights()[0][0].data_ptr() == copies[0][0].data_ptr()
    model = eng.unwrap_moe()  # export: the stock blocks back, sharing the same weights
    block = model.base_model.model.model.layers[0].mlp
    assert block is eng.stock_blocks[0]
    assert block.experts.gate_up_proj.data_ptr() == copies[0][0].data_ptr()
    assert torch.equal(block.experts.down_proj, copies[0][1])
