"""Hot experts: selection rule, buckets, hot+cold == host-only, device calls per layer."""

from __future__ import annotations

import copy

import pytest
import torch
from npu_lora.api.sizing import default_buckets, hot_count
from npu_lora.backends import CpuBackend
from npu_lora.engine import build_engine
from npu_lora.moe import (
    HostMLP,
    choose_bucket,
    make_hot_layer,
    pick_bucket,
    select_hot,
)

# fp32, CPU backend: the hot path is bmm, the host-only path grouped_mm; the per-pair products and
# the top-k summation order are the same, only GEMM reduction order may differ. Measured on the
# tiny model (torch 2.13 CPU): outputs and input grads bitwise equal (max abs diff 0) for 2 and
# 8 hot experts. Asserted tolerance (other widths/BLAS paths may reorder reductions):
HOT_RTOL, HOT_ATOL = 1e-5, 1e-6


def test_select_hot_rule_and_ties():
    counts = torch.tensor([[5, 9, 9, 1, 0, 9, 2, 3], [0] * 8])
    assert hot_count(0.25, 8) == 2 and hot_count(0.3, 8) == 3 and hot_count(0.01, 8) == 1
    assert hot_count(1.0, 8) == 8
    # ties at 9: experts 1, 2, 5 → the lower indices win; all-zero layer → experts 0, 1
    assert select_hot(counts, 0.25) == [[1, 2], [0, 1]]
    assert select_hot(counts, 0.5) == [[0, 1, 2, 5], [0, 1, 2, 3]]


def test_buckets():
    assert default_buckets(64, 2) == (8, 16, 32, 64)
    assert default_buckets(100, 4) == (8, 16, 32, 64, 128)
    assert default_buckets(4, 2) == (4,)
    assert pick_bucket(9, (8, 16, 32)) == 16
    with pytest.warns(UserWarning):
        assert pick_bucket(40, (8, 16, 32)) == 64


def test_choose_bucket_trades_padding_against_host_overflow():
    counts = torch.tensor([100, 5, 5, 5])
    b = (8, 16, 32, 64, 128)
    # pad to the largest group: 4·128 rows
    assert choose_bucket(counts, b, capacity="max", row_bytes=10, expert_bytes=1000) == 128
    # cost: 128 → 5120; 64 → 2560 + 1000; 32 → 2280; 16 → 1640; 8 → 320 + 1000 = 1320 (min)
    assert choose_bucket(counts, b, row_bytes=10, expert_bytes=1000) == 8
    # an overflowing expert costs more than any padding saved: no overflow
    assert choose_bucket(counts, b, row_bytes=10, expert_bytes=10**9) == 128
    # tie (128·4·1 = 512 vs 8·4·1 + 480 = 512): the larger bucket, less host work
    assert choose_bucket(counts, b, row_bytes=1, expert_bytes=480) == 128
    # no expert size known: the old rule
    assert choose_bucket(counts, b, row_bytes=10, expert_bytes=0) == 128
    assert choose_bucket(torch.tensor([3, 0]), b, row_bytes=10, expert_bytes=10) == 8
    with pytest.raises(ValueError, match="capacity"):
        choose_bucket(counts, b, capacity="min", row_bytes=1, expert_bytes=1)


@pytest.mark.parametrize(
    ("fraction", "capacity"), [(0.25, "max"), (1.0, "max"), (0.25, "overflow"), (1.0, "overflow")]
)
def test_hot_cold_equals_host_only(tiny, fraction, capacity):
    """Block output and input gradient with hot experts == the host-only block (tolerance),
    also when hot pairs overflow their bucket and are computed on the host."""
    eng = build_engine(tiny.spec())
    block = eng.mlps[0]._block
    backend = CpuBackend()
    ref = HostMLP(copy.deepcopy(block), layer=0, backend=backend)
    hot = HostMLP(copy.deepcopy(block), layer=0, backend=backend)
    ids = select_hot(torch.arange(8)[None].flip(1), fraction)[0]  # prefer low expert ids
    hot.hot = make_hot_layer(
        hot.experts, ids, backend, buckets=(8, 16, 32, 64), device_dtype=torch.float32
    )
    if capacity == "max":
        hot.hot.capacity = "max"
    else:  # overflow is nearly free: the smallest bucket wins and the big groups overflow
        hot.hot.expert_bytes = 1
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 32, 64, generator=g)
    gy = torch.randn(2, 32, 64, generator=g)
    outs = []
    for mlp in (ref, hot):
        xx = x.clone().requires_grad_(True)
        y = mlp(xx)
        y.backward(gy)
        outs.append((y.detach(), xx.grad))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=HOT_RTOL, atol=HOT_ATOL)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=HOT_RTOL, atol=HOT_ATOL)
    assert backend.calls_by_name["hot_experts"] == 1
    h = hot.hot
    hot_pairs = h.pairs_device + h.pairs_overflow  # one plan: 2·32 tokens × top-2 = 128 pairs
    assert hot_pairs == 128 if fraction == 1.0 else 0 < hot_pairs < 128
    if capacity == "max":
        assert h.pairs_overflow == 0 and not h.overflow_E.any()
    else:
        assert h.pairs_overflow > 0 and list(h.bucket_hist) == [8]
        assert set(h.overflow_E.nonzero().flatten().tolist()) <= set(ids)


@pytest.mark.parametrize(
    ("placement", "keep", "expected"),
    [("host-only", True, 1.0), ("host-only", False, 1.0), ("hot", True, 2.0), ("hot", False, 3.0)],
)
def test_device_calls_per_layer(tiny, placement, keep, expected):
    spec = tiny.spec(moe={"placement": placement, "keepGraph": keep, "warmupSteps": 1})
    eng = build_engine(spec)
    batch = tiny.batch()
    prof = eng.forward_backward(batch)
    assert prof.device_calls_per_layer == 1.0 and prof.hot_experts == 0
    info = eng.select_hot_experts(1)
    assert bool(info) is (placement == "hot")
    prof = eng.forward_backward(batch)
    assert prof.device_calls_per_layer == expected
    assert prof.device_calls["embed"] == 1 and prof.device_calls["head"] == 1
    if placement == "hot":
        assert prof.hot_experts == 2 * eng.num_layers  # ceil(0.25 * 8) per layer
        assert eng.select_hot_experts(2) == {}  # the hot set is fixed


def test_hot_engine_matches_host_only_engine(tiny):
    """Whole model: loss and LoRA grads with hot experts == host-only (tolerance)."""
    batch = tiny.batch()
    res = {}
    for placement in ("host-only", "hot"):
        eng = build_engine(tiny.spec(moe={"placement": placement, "warmupSteps": 0}))
        tiny.randomize_lora(eng.model)
        eng.select_hot_experts(0)
        prof = eng.forward_backward(batch)
        res[placement] = (prof.loss, {n: p.grad for n, p in eng.adapter.named_parameters()})
    assert abs(res["hot"][0] - res["host-only"][0]) < 1e-5
    for n, gref in res["host-only"][1].items():
        torch.testing.assert_close(res["hot"][1][n], gref, rtol=1e-4, atol=1e-6)


def test_hot_state_roundtrip(tiny):
    spec = tiny.spec(moe={"placement": "hot", "warmupSteps": 1})
    eng = build_engine(spec)
    assert eng.hot_state() is None
    eng.forward_backward(tiny.batch())
    assert eng.select_hot_experts(0) == {}  # still warming up
    info = eng.select_hot_experts(1)
    state = eng.hot_state()
    assert state is not None and state["per_layer"] == info["per_layer"]
    import json

    state = json.loads(json.dumps(state))
    eng2 = build_engine(spec)
    eng2.load_hot_state(state)
    assert eng2.hot_state() == state
    assert [m.hot.experts for m in eng2.mlps] == info["per_layer"]
    eng3 = build_engine(spec)
    eng3.hotset.load_routing_counts(torch.tensor(state["routing_counts"]))
    assert eng3.select_hot_experts(1)["per_layer"] == info["per_layer"]  # same choice on resume
    eng2.load_hot_state(None)
    assert (
        eng2.hot_state() is None
        and eng2.forward_backward(tiny.batch()).device_calls_per_layer == 1.0
    )


def test_set_mode_is_the_one_owner_of_the_mode(tiny):
    """HostMLPs read the engine's mode; leaving ``hot`` parks the hot set, coming back restores
    it; the engine refuses a mode it cannot run; the mode object is immutable."""
    import dataclasses

    from npu_lora.engine import EngineMode

    eng = build_engine(tiny.spec(moe={"placement": "hot", "warmupSteps": 0, "keepGraph": True}))
    eng.select_hot_experts(0)
    hot = [m.hot for m in eng.mlps]
    assert all(h is not None for h in hot) and all(m.keep_graph for m in eng.mlps)
    eng.modes.set(EngineMode("host-only", keep_graph=False, overlap=True))
    assert eng.modes.placement == "host-only" and not eng.modes.keep_graph and eng.modes.overlap
    assert all(m.hot is None and not m.keep_graph and m.overlap for m in eng.mlps)
    assert eng.forward_backward(tiny.batch()).hot_experts == 0
    eng.modes.set(dataclasses.replace(eng.modes.mode, placement="hot"))
    assert [m.hot for m in eng.mlps] == hot
    with pytest.raises(dataclasses.FrozenInstanceError):
        eng.modes.mode.keep_graph = True  # type: ignore[misc]
    with pytest.raises(ValueError, match="placement must be 'hot' or 'host-only'"):
        EngineMode("gpu")  # type: ignore[arg-type]
    from npu_lora.engine.mode import ModeControl

    trained = ModeControl("auto", True, False, train_experts=True)  # auto = host-only
    assert trained.policy == "host-only" and trained.mode.placement == "host-only"
    with pytest.raises(ValueError, match="train_experts requires placement host-only"):
        trained.set(eng.modes.mode)
    assert trained.mode.placement == "host-only"  # refused: unchanged
