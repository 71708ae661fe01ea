"""``expert_bytes``: the host expert weight bytes a micro-batch read, counted per kernel call."""

from __future__ import annotations

import pytest
from npu_lora.engine import build_engine
from npu_lora.moe.experts import expert_bytes, hit_expert_bytes


def _routed_hits(eng, batch) -> int:
    """Hit-expert bytes of one forward over all layers, from the routing the gate produces
    (hooks on the gates, independent of the counter under test)."""
    got: list[int] = []

    def hook(mod, _inp, out):
        mlp = next(m for m in eng.mlps if m.gate is mod)
        got.append(hit_expert_bytes(out[2], mlp.experts.gate_up_proj, mlp.experts.down_proj))

    handles = [m.gate.register_forward_hook(hook) for m in eng.mlps]
    try:
        eng.token_nll(batch)
    finally:
        for h in handles:
            h.remove()
    assert len(got) == eng.num_layers
    return sum(got)


@pytest.mark.parametrize(("keep_graph", "passes"), [(True, 2), (False, 3)])
def test_expert_bytes_counts_every_pass_over_the_hit_experts(tiny, keep_graph, passes):
    """host-only: keepGraph reads the hit experts forward + backward, without it forward +
    recompute + backward; the bytes are the hit experts' (not all experts')."""
    eng = build_engine(tiny.spec(moe={"placement": "host-only", "keepGraph": keep_graph}))
    batch = tiny.batch()
    hits = _routed_hits(eng, batch)
    m = eng.mlps[0].experts
    one = expert_bytes(m.gate_up_proj, m.down_proj)
    assert 0 < hits <= eng.num_layers * eng.num_experts * one and hits % one == 0
    prof = eng.forward_backward(batch)
    assert prof.expert_bytes == passes * hits
    assert eng.forward_backward(batch).expert_bytes == passes * hits  # reset per micro-batch


def test_expert_bytes_leaves_out_the_hot_experts(tiny):
    """With every expert hot (hotFraction 1) the host streams none; with a quarter hot, less
    than host-only."""
    batch = tiny.batch()
    base = build_engine(tiny.spec(moe={"placement": "host-only"})).forward_backward(batch)
    out = {}
    for frac in (0.25, 1.0):
        eng = build_engine(
            tiny.spec(moe={"placement": "hot", "warmupSteps": 0, "hotFraction": frac})
        )
        eng.forward_backward(batch)  # routing counts for the choice
        eng.select_hot_experts(1)
        out[frac] = eng.forward_backward(batch).expert_bytes
    assert out[1.0] == 0
    assert 0 < out[0.25] < base.expert_bytes


def test_expert_bytes_in_the_profile_dict(tiny):
    eng = build_engine(tiny.spec())
    d = eng.forward_backward(tiny.batch()).to_dict()
    assert isinstance(d["expert_bytes"], int) and d["expert_bytes"] > 0
