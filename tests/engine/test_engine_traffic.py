"""Traffic accounting at the device seam, placement auto, hot-set refresh and hotMemory."""

from __future__ import annotations

import itertools
import json
import time

import pytest
import torch
from npu_lora.backends import CpuBackend
from npu_lora.device.graphs import causal_mask, label_gather, positions
from npu_lora.engine import build_engine
from npu_lora.moe.hot import coverage, device_expert_bytes, select_hot, select_hot_memory


def _input_bytes(batch: dict, dt: torch.dtype) -> int:
    """What the engine sends before the first layer: mask, positions, label gather, ids."""
    ids, labels = batch["input_ids"], batch["labels"]
    B, S = ids.shape
    lg = label_gather(labels, dt)
    ts = [causal_mask(batch["attention_mask"], B, S, dt), positions(B, S)]
    ts += [lg.sel_BNS, lg.labels_BN, lg.w_BN, ids.to(torch.int32)]
    return sum(t.numel() * t.element_size() for t in ts)


@pytest.mark.parametrize("placement", ["host-only", "hot"])
def test_counted_bytes_match_the_arithmetic(tiny, placement):
    """Per layer and in total, forward and backward, against B, S, D, Eh, Bk and the dtypes."""
    spec = tiny.spec(moe={"placement": placement, "warmupSteps": 0, "keepGraph": True})
    eng = build_engine(spec)
    batch = tiny.batch()
    B, S = batch["input_ids"].shape
    D = eng.config.hidden_size
    I = eng.config.moe_intermediate_size  # noqa: E741
    dt = eng.device_dtype
    n = dt.itemsize
    eng.select_hot_experts(0)
    hot = [m.hot for m in eng.mlps]
    for h in hot:
        if h is not None:
            h.bucket_hist.clear()
    prof = eng.forward_backward(batch)
    per = prof.traffic_layers
    moved = 0
    for i, h in enumerate(hot):
        # HostMLP: block input to the host, output back (forward); their gradients (backward)
        h2d = d2h = 2 * B * S * D * n
        if h is not None:
            ((Bk, calls),) = h.bucket_hist.items()  # one hot call per layer (keep_graph)
            assert calls == 1
            rows = h.num_hot * Bk
            h2d += rows * D * n + rows * n + rows * D * n  # x, r; then dy of the hot output
            d2h += rows * D * n + rows * D * n + rows * n  # y; then dx, dr
            moved += h.num_hot * (2 * I * D + D * I) * n  # the selection's weight copies
            h2d += h.num_hot * (2 * I * D + D * I) * n
        assert per["to_device_bytes"][i] == h2d, i
        assert per["to_host_bytes"][i] == d2h, i
    assert prof.move_bytes == moved
    assert prof.to_device_bytes == sum(per["to_device_bytes"]) + _input_bytes(batch, dt)
    assert prof.to_host_bytes == sum(per["to_host_bytes"])  # the loss comes back as a Python float
    assert prof.copy_mb == pytest.approx((prof.to_device_bytes + prof.to_host_bytes) / 1e6)
    assert prof.to_device_s >= 0 and prof.to_host_s >= 0
    # the next step moves no weights
    assert eng.forward_backward(batch).move_bytes == 0


def test_a_cast_on_the_way_counts_the_device_dtype():
    """Sent in the device dtype (bf16: 2 bytes an element), the gradient comes back in it and
    is cast to the host dtype on the host."""
    be = CpuBackend()
    x = torch.randn(6, 4, requires_grad=True)
    y = be.to_device(x, layer=3, dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert be.traffic.to_device_bytes[3] == 6 * 4 * 2 and be.traffic.to_host_bytes[3] == 6 * 4 * 2
    assert x.grad.dtype == torch.float32 and torch.equal(x.grad, torch.ones(6, 4))


def test_staging_buffers_are_reused():
    be = CpuBackend()
    a = be.staging("x", (4, 8), torch.bfloat16)
    b = be.staging("x", (2, 8), torch.bfloat16)
    assert be.staging_allocs == 1 and a.data_ptr() == b.data_ptr() and b.shape == (2, 8)
    be.staging("x", (16, 8), torch.float32)  # larger: grows once
    be.staging("x", (16, 8), torch.float32)
    assert be.staging_allocs == 2


class DelayBackend(CpuBackend):
    """The cpu backend with a delay injected into one kind of device call."""

    def __init__(self, slow: str, seconds: float, engine_placement: str | None = None) -> None:
        super().__init__()
        self.slow, self.seconds, self.when = slow, seconds, engine_placement
        self.engine = None

    def call(self, name, fn, *args, layer=None):
        if name == self.slow and (self.when is None or self.engine.modes.placement == self.when):
            time.sleep(self.seconds)
        return super().call(name, fn, *args, layer=layer)


# the injected delay (per layer and step) dwarfs a loaded 2-core machine's noise (a 0.5 s delay
# lost to a 1.9 s host-only step median in a CI run beside other jobs)
@pytest.mark.parametrize(
    ("backend_args", "expect"),
    [
        (("hot_experts", 1.5), "host-only"),  # the hot call made slow: host-only wins
        (("attention", 1.5, "host-only"), "hot"),  # host-only steps made slow: hot wins
    ],
)
def test_auto_keeps_the_faster_placement(tiny, backend_args, expect):
    be = DelayBackend(*backend_args)
    eng = build_engine(tiny.spec(moe={"placement": "auto", "warmupSteps": 1}), backend=be)
    be.engine = eng
    batch = tiny.batch()
    seen = []
    for step in range(1, 10):
        prof = eng.forward_backward(batch)
        seen.append(prof.placement if prof.hot_experts or prof.placement != "hot" else "-")
        eng.select_hot_experts(step)
    choice = eng.placement_choice()
    # step 1 counts routing; steps 2..7 alternate (H D, D H, H D); then the faster one
    assert seen[:7] == ["-", "host-only", "hot", "hot", "host-only", "host-only", "hot"]
    assert choice["chosen"] == expect and choice["decided_at_step"] == 7, choice
    assert seen[7:] == [expect, expect]
    slow, fast = (
        ("hot_median_s", "host_only_median_s")
        if expect == "host-only"
        else ("host_only_median_s", "hot_median_s")
    )
    assert choice[slow] > choice[fast]
    assert [t[0] for t in choice["trials"]] == seen[1:7]


def test_auto_keeps_the_agreed_choice(tiny):
    """Data parallel: each rank times its own trials, ``agree_placement_with`` (rank 0's choice, a
    broadcast) decides, so every rank keeps the same placement even where its own medians
    disagree."""
    be = DelayBackend("hot_experts", 1.5)  # this rank alone would keep host-only
    eng = build_engine(tiny.spec(moe={"placement": "auto", "warmupSteps": 1}), backend=be)
    be.engine = eng
    asked: list[str] = []
    eng.agree_placement_with(lambda mine: asked.append(mine) or "hot")
    batch = tiny.batch()
    for step in range(1, 9):
        eng.forward_backward(batch)
        eng.select_hot_experts(step)
    assert asked == ["host-only"]  # asked once, at the decision, with this rank's own choice
    assert eng.placement_choice()["chosen"] == "hot" and eng.modes.placement == "hot"


def test_auto_with_trained_experts_is_host_only(tiny):
    spec = tiny.spec(moe={"placement": "auto", "warmupSteps": 0}, lora={"trainExperts": True})
    eng = build_engine(spec)
    assert eng.modes.policy == "host-only" and eng.select_hot_experts(0) == {}


def test_refresh_moves_only_changed_experts_and_gradients_stay_exact(tiny):
    """A refresh copies exactly the entering experts (counted); after the move the step equals,
    bitwise, a fresh engine given the same hot set, and matches host-only to rounding."""
    spec = tiny.spec(moe={"placement": "hot", "warmupSteps": 0, "hotRefreshSteps": 1})
    eng = build_engine(spec)
    tiny.randomize_lora(eng.model)
    L, E = eng.num_layers, eng.num_experts
    # the first choice from made-up counts: the two least-routed experts of the real batch
    batch = tiny.batch()
    probe = build_engine(spec)
    probe.forward_backward(batch)
    real = probe.hotset.routing_counts()
    made_up = real.max() - real
    eng.hotset.load_routing_counts(made_up)
    assert eng.select_hot_experts(0)["per_layer"] == select_hot(made_up, 0.25)
    before = [list(m.hot.experts) for m in eng.mlps]
    w_before = [m.hot.module.w_gate_up_EhFD.clone() for m in eng.mlps]
    eng.forward_backward(batch)
    for p in eng.adapter.parameters():
        p.grad = None
    info = eng.select_hot_experts(1)  # refresh: hist = 0.5·old + this step's counts
    assert info["refreshed_at_step"] == 1
    hist = 0.5 * made_up.double() + (eng.hotset.routing_counts() - made_up).double()
    want = select_hot(hist, 0.25)
    assert [sorted(m.hot.experts) for m in eng.mlps] == want
    entered = sum(len(set(w) - set(b)) for w, b in zip(want, before, strict=True))
    assert entered > 0
    eb = device_expert_bytes(eng.mlps[0].experts, eng.device_dtype)
    for m, b, w0 in zip(eng.mlps, before, w_before, strict=True):
        for s, e in enumerate(m.hot.experts):  # kept experts stayed in their slots
            if e in b:
                assert b.index(e) == s and torch.equal(m.hot.module.w_gate_up_EhFD[s], w0[s])
            torch.testing.assert_close(
                m.hot.module.w_gate_up_EhFD[s], m.experts.gate_up_proj[e].to(eng.device_dtype)
            )
    hist_rec = eng.hotset.history[-1]
    assert hist_rec["experts_moved"] == entered and hist_rec["move_bytes"] == entered * eb
    prof = eng.forward_backward(batch)
    assert prof.move_bytes == entered * eb
    grads = {n: p.grad.clone() for n, p in eng.adapter.named_parameters()}

    fresh = build_engine(spec)
    tiny.randomize_lora(fresh.model)
    fresh.load_hot_state({"selected_at_step": 0, "per_layer": [m.hot.experts for m in eng.mlps]})
    prof2 = fresh.forward_backward(batch)
    assert prof2.loss == prof.loss
    for n, p in fresh.adapter.named_parameters():
        assert torch.equal(p.grad, grads[n]), n
    host = build_engine(tiny.spec(moe={"placement": "host-only"}))
    tiny.randomize_lora(host.model)
    prof3 = host.forward_backward(batch)
    assert abs(prof3.loss - prof.loss) < 1e-5
    for n, p in host.adapter.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6)
    assert L * E > 0


def test_hot_state_keeps_the_histogram_and_history_across_resume(tiny):
    spec = tiny.spec(moe={"placement": "hot", "warmupSteps": 1, "hotRefreshSteps": 2})
    eng = build_engine(spec)
    batches = [tiny.batch(seed=s) for s in range(6)]
    eng.forward_backward(batches[0])
    eng.select_hot_experts(1)
    for step in (2, 3):
        eng.forward_backward(batches[step])
        eng.select_hot_experts(step)
    state = json.loads(json.dumps(eng.hot_state()))
    assert "hist" in state and "counts_at_refresh" in state and state["history"]
    resumed = build_engine(spec)
    resumed.load_hot_state(state)
    assert resumed.hot_state() == state
    for e in (eng, resumed):  # the same next refresh in both
        for step in (4, 5):
            e.forward_backward(batches[step])
            e.select_hot_experts(step)
    assert [m.hot.experts for m in resumed.mlps] == [m.hot.experts for m in eng.mlps]
    assert torch.equal(resumed.hotset.hist_LE, eng.hotset.hist_LE)
    assert resumed.hotset.history == eng.hotset.history


def test_select_hot_memory_is_optimal_and_beats_the_per_layer_rule():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        counts = torch.randint(0, 50, (2, 4), generator=g)
        for n in range(0, 9):
            got = select_hot_memory(counts, n * 100 + 99, 100)  # room for n experts
            assert sum(len(x) for x in got) == n
            best = max(
                (
                    sum(int(counts[i // 4, i % 4]) for i in c)
                    for c in itertools.combinations(range(8), n)
                ),
                default=0,
            )
            assert sum(int(counts[i, ids].sum()) for i, ids in enumerate(got) if ids) == best
    skew = torch.tensor([[90, 80, 70, 60], [5, 4, 3, 2]])
    cross = select_hot_memory(skew, 400, 100)
    assert cross == [[0, 1, 2, 3], []]
    assert coverage(skew, cross) > coverage(skew, select_hot(skew, 0.5))


def test_hot_memory_in_the_engine_and_its_report(tiny):
    eng0 = build_engine(tiny.spec(moe={"placement": "hot", "warmupSteps": 1}))
    eb = device_expert_bytes(eng0.mlps[0].experts, eng0.device_dtype)
    L = eng0.num_layers
    budget = 3 * L * eb + eb // 2  # room for 3 experts per layer on average
    spec = tiny.spec(moe={"placement": "hot", "warmupSteps": 1, "hotMemory": str(budget)})
    eng = build_engine(spec)
    eng.forward_backward(tiny.batch())
    info = eng.select_hot_experts(1)
    mem = info["memory"]
    assert mem["budget_bytes"] == budget and mem["experts"] == 3 * L
    assert mem["used_bytes"] == 3 * L * eb <= budget
    counts = eng.hotset.routing_counts()
    assert mem["coverage"] == pytest.approx(coverage(counts, info["per_layer"]))
    assert mem["per_layer_fraction_experts"] == 3 * L
    assert mem["coverage"] >= mem["per_layer_fraction_coverage"]
    assert info["per_layer"] == select_hot_memory(counts, budget, eb)


@pytest.mark.parametrize(
    ("value", "ok"), [("12Gi", 12 * 2**30), ("1.5G", 1_500_000_000), ("512", 512)]
)
def test_hot_memory_quantities(tiny, value, ok):
    spec = tiny.spec(moe={"hotMemory": value})
    assert spec.moe.hot_memory_bytes == ok


@pytest.mark.parametrize("value", ["12GB", "-1Gi", "lots", "0"])
def test_hot_memory_rejects_bad_quantities(tiny, value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        tiny.spec(moe={"hotMemory": value})
    text = str(e.value)
    assert "hotMemory" in text and ("Ki, Mi, Gi" in text or "more than 0 bytes" in text), text


def test_hot_memory_refresh_moves_budget_between_layers(tiny):
    """With a budget across layers a refresh may change a layer's size: the kept experts'
    weights are gathered on the device, the entering ones copied; every slot holds its expert's
    weights and the step equals a fresh engine given the same set, bitwise."""
    eng0 = build_engine(tiny.spec(moe={"placement": "hot", "warmupSteps": 0}))
    eb = device_expert_bytes(eng0.mlps[0].experts, eng0.device_dtype)
    L, E = eng0.num_layers, eng0.num_experts
    moe = {"placement": "hot", "warmupSteps": 0, "hotMemory": str(2 * L * eb), "hotRefreshSteps": 1}
    eng = build_engine(tiny.spec(moe=moe))
    skew = torch.zeros(L, E, dtype=torch.int64)
    skew[0] = torch.arange(E, 0, -1) * 1000  # layer 0 takes the whole budget
    eng.hotset.load_routing_counts(skew)
    eng.select_hot_experts(0)
    assert len(eng.mlps[0].hot.experts) == 2 * L and all(m.hot is None for m in eng.mlps[1:])
    batch = tiny.batch()
    eng.forward_backward(batch)
    state = eng.hot_state()  # forget the skew (the batch decides): recent = this batch only
    state.update(hist=torch.zeros(L, E).tolist(), counts_at_refresh=skew.tolist())
    eng.load_hot_state(state)
    assert eng.select_hot_experts(1)["refreshed_at_step"] == 1
    sizes = [len(m.hot.experts) if m.hot else 0 for m in eng.mlps]
    assert sum(sizes) == 2 * L and sizes[0] < 2 * L
    for m in eng.mlps:
        for s, e in enumerate(m.hot.experts if m.hot else []):
            assert torch.equal(m.hot.module.w_down_EhDI[s], m.experts.down_proj[e])
    for p in eng.adapter.parameters():
        p.grad = None
    prof = eng.forward_backward(batch)
    fresh = build_engine(tiny.spec(moe=moe))
    fresh.load_hot_state(
        {"selected_at_step": 0, "per_layer": [m.hot.experts if m.hot else [] for m in eng.mlps]}
    )
    prof2 = fresh.forward_backward(batch)
    assert prof.loss == prof2.loss
    got = dict(eng.adapter.named_parameters())
    for n, p in fresh.adapter.named_parameters():
        assert torch.equal(p.grad, got[n].grad), n


def test_auto_state_survives_a_resume_mid_trial(tiny):
    spec = tiny.spec(moe={"placement": "auto", "warmupSteps": 1})
    eng = build_engine(spec)
    batch = tiny.batch()
    for step in range(1, 4):  # selection after 1, trials 2 and 3 recorded
        eng.forward_backward(batch)
        eng.select_hot_experts(step)
    state = json.loads(json.dumps(eng.hot_state()))
    assert [t[0] for t in state["auto"]["trials"]] == ["host-only", "hot"]
    resumed = build_engine(spec)
    resumed.load_hot_state(state)
    assert resumed.modes.placement == eng.modes.placement == "hot"  # round 1 starts with hot
    assert resumed.placement_choice() == eng.placement_choice()
    assert [m.hot.experts for m in resumed.mlps] == [m.hot.experts for m in eng.mlps]


def test_device_gather_sends_token_rows_and_computes_the_same(tiny):
    """Eh·Bk > T: the T token rows go to the device once with an int32 row index, the gather,
    the experts and the per-token sum run there (and their backward); T rows come back. Same
    loss and gradients as the padded path to rounding (another top-k summation order)."""
    spec = tiny.spec(moe={"placement": "hot", "warmupSteps": 0, "bucketSizes": [64]})
    batch = tiny.batch()
    B, S = batch["input_ids"].shape
    res = {}

    class NoGather(CpuBackend):
        device_gather = False

    for gather in (True, False):
        eng = build_engine(spec, backend=CpuBackend() if gather else NoGather())
        assert eng.hotset.device_gather is gather
        tiny.randomize_lora(eng.model)
        eng.select_hot_experts(0)
        eng.forward_backward(batch)  # the selection's copies
        for p in eng.adapter.parameters():
            p.grad = None
        for m in eng.mlps:
            m.hot.bucket_hist.clear()
        prof = eng.forward_backward(batch)
        res[gather] = (prof, {n: p.grad for n, p in eng.adapter.named_parameters()}, eng)
    (on, g_on, eng), (off, g_off, _) = res[True], res[False]
    assert abs(on.loss - off.loss) < 1e-6
    for n, g in g_off.items():
        torch.testing.assert_close(g_on[n], g, rtol=1e-5, atol=1e-7)
    D, n = eng.config.hidden_size, eng.device_dtype.itemsize
    T = B * S
    for i, m in enumerate(eng.mlps):
        ((Bk, _),) = m.hot.bucket_hist.items()
        rows = m.hot.num_hot * Bk
        assert rows > T
        base = 2 * T * D * n  # HostMLP's own copies (forward and backward)
        on_dev, on_host = (
            on.traffic_layers["to_device_bytes"][i],
            on.traffic_layers["to_host_bytes"][i],
        )
        # →device: token rows, int32 index, weights; backward: dy of the per-token sum
        assert on_dev == base + 2 * T * D * n + rows * (4 + n)
        # →host: the per-token sum; backward: dx of the token rows, dr
        assert on_host == base + 2 * T * D * n + rows * n
        saved = 2 * (rows - T) * D * n
        assert off.traffic_layers["to_device_bytes"][i] - on_dev == saved - rows * 4
        assert off.traffic_layers["to_host_bytes"][i] - on_host == saved
