"""The plan matches what the engine runs on the device: every device call's input shapes and
dtypes are those of a graph of the plan (a backend that records every call)."""

from __future__ import annotations

import torch
from npu_lora.backends.cpu import CpuBackend
from npu_lora.compile.plan import compile_plan
from npu_lora.engine import build_engine

from .helpers import make_spec


class RecordingBackend(CpuBackend):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, tuple]] = set()

    def call(self, name, fn, *args, layer=None):
        sig = tuple(
            (tuple(a.shape), str(a.dtype).removeprefix("torch."))
            for a in args
            if isinstance(a, torch.Tensor)
        )
        self.seen.add((name, sig))
        return super().call(name, fn, *args, layer=layer)


def _batch(B: int, S: int, vocab: int, answer: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, S), generator=g)
    labels = torch.full_like(ids, -100)
    labels[:, S - answer :] = ids[:, S - answer :]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def test_every_device_call_is_a_graph_of_the_plan():
    spec = make_spec(
        moe={
            "placement": "hot",
            "warmupSteps": 1,
            "hostDtype": "float32",
            "expertsKernel": "grouped_mm",
        },
        training={"seqLen": 32, "batchSize": 2},
    )
    be = RecordingBackend()
    eng = build_engine(spec, vocab_size=512, backend=be)
    plan = compile_plan(spec, backend="cpu")
    planned = {
        (e.graph, tuple((tuple(i["shape"]), i["dtype"]) for i in e.inputs)) for e in plan.entries
    }
    kind = {"embed": "DeviceEmbed", "attention": "DeviceAttentionBlock", "head": "DeviceHead"}
    for step, answer in enumerate((3, 9, 20, 31)):  # several label buckets
        eng.forward_backward(_batch(2, 32, 512, answer, step))
        eng.select_hot_experts(step + 1)
    assert {n for n, _ in be.seen} == {"embed", "attention", "head", "hot_experts"}
    assert len({sig for n, sig in be.seen if n == "head"}) >= 3  # several label buckets N
    for name, sig in be.seen:
        if name == "hot_experts":  # batched [Eh,Bk,D],[Eh,Bk] or gathered [T,D],[Eh,Bk],[Eh,Bk]
            graph = "HotExpertsBatched" if len(sig) == 2 else "HotExpertsGathered"
        else:
            graph = kind[name]
        key = (graph, tuple((tuple(s), d) for s, d in sig))
        assert key in planned, (name, sig)
