"""``npu-lora bench``: the A/B harness on the tiny model (fast), its statistics and its CLI."""

from __future__ import annotations

import json
import math
import os
import warnings

import pytest
import torch
from npu_lora.bench import harness as h
from npu_lora.bench.limits import effective_bandwidth, fraction_of, hit_bytes, stream_bandwidth

from .records import step

warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")


def test_variant_parse():
    v = h.Variant.parse("hot+keep_graph@npu_lora_sorted")
    assert (v.placement, v.keep_graph, v.experts_impl, v.is_peer) == (
        "hot",
        True,
        "npu_lora_sorted",
        False,
    )
    assert h.Variant.parse("host-only") == h.Variant("host-only", "host-only", False, None)
    assert h.Variant.parse("peer@eager").is_peer
    assert h.Variant.parse("hot+keep_graph+sequential").sequential
    assert not h.Variant.parse("hot+keep_graph").sequential
    assert h.Variant.parse("hot+padmax").padmax and not h.Variant.parse("hot").padmax
    assert h.Variant.parse("hot+overlap").overlap and not h.Variant.parse("hot").overlap
    assert h.Variant.parse("host-only+torch_head").torch_head
    assert not h.Variant.parse("host-only").torch_head
    assert h.Variant.parse("peer+fp32@grouped_mm").fp32 and h.Variant.parse("peer+fp32").is_peer
    assert not h.Variant.parse("peer@grouped_mm").fp32
    assert h.Variant.parse("host-only+keep_graph+fp32@npu_lora_stream").fp32
    v = h.Variant.parse("host-only+keep_graph+fp32+4k@npu_lora_stream")
    assert v.plain_pages and v.fp32 and not h.Variant.parse("host-only").plain_pages
    v = h.Variant.parse("peer+fp32+sdpa@grouped_mm")
    assert v.sdpa and v.fp32 and v.is_peer and not h.Variant.parse("peer").sdpa
    for bad in (
        "hot+overlap+sequential",
        "device",
        "hot+fast",
        "peer+keep_graph",
        "host-only+sequential",
        "host-only+padmax",
        "peer+torch_head",
        "hot+fp32",
        "hot+4k",
        "peer+4k",
        "host-only+sdpa",
        "hot+sdpa",
    ):
        with pytest.raises(ValueError):
            h.Variant.parse(bad)


def test_long_rows_add_the_sdpa_peer_beside_the_eager_one():
    """From SDPA_MIN_SEQ our attention runs sdpa on cpu: the bench then pairs us with stock on
    transformers' default (sdpa) attention too, not only with the eager peer."""
    from npu_lora.api.sizing import SDPA_MIN_SEQ
    from npu_lora.bench.config import BenchConfig

    short = BenchConfig(variants=["host-only"], peer_impls=["grouped_mm"], seq_len=128)
    assert [v.name for v in h._variants(short)[0]] == ["host-only", "peer@grouped_mm"]
    long = BenchConfig(variants=["host-only"], peer_impls=["grouped_mm"], seq_len=SDPA_MIN_SEQ)
    names = [v.name for v in h._variants(long)[0]]
    assert names == ["host-only", "peer@grouped_mm", "peer+sdpa@grouped_mm"]
    assert h._variants(long)[0][2].sdpa
    given = BenchConfig(
        variants=["host-only", "peer+sdpa@grouped_mm"],
        peer_impls=["grouped_mm"],
        seq_len=SDPA_MIN_SEQ,
    )
    assert [v.name for v in h._variants(given)[0]].count("peer+sdpa@grouped_mm") == 1
    assert [
        v.name
        for v in h._variants(BenchConfig(variants=["host-only"], seq_len=4096, peers=False))[0]
    ] == ["host-only"]


def test_summarize_paired_deltas():
    recs = []
    # a drifting machine: every round slower, B always 0.5 s faster than A within the round
    for k in range(6):
        recs += [step("A", k, 2.0 + k, host_bwd_s=1.0), step("B", k, 1.5 + k, host_bwd_s=0.5)]
    s = h.summarize(recs, ["A", "B"], "A")
    d = s["deltas"]["B"]
    assert d["median_delta_s"] == pytest.approx(-0.5)
    assert d["same_sign_rounds"] == 6 and d["rounds"] == 6
    assert s["medians"]["A"]["step_s"] == pytest.approx(4.5)
    assert s["deltas"]["A"]["median_delta_s"] == 0
    table = h.render_table(s, ["A", "B"])
    assert "| B | 4.000 |" in table and "-0.500 s (6/6)" in table


def test_kernel_variant_is_paired_with_the_peer_against_the_target():
    """``host-only+keep_graph@<kernel>`` is the variant the step target is measured with: it is
    paired with every peer (step and CPU time) and judged against ≤ 0.75x."""
    v, peer = "host-only+keep_graph@npu_lora_stream", "peer@grouped_mm"
    recs = []
    for k in range(3):
        recs += [step(v, k, 2.0 + k, cpu_s=4.0), step(peer, k, 3.0 + k, cpu_s=6.0)]
    s = h.summarize(recs, [v, peer], v)
    pair = s["pairs"][f"{v} / {peer} : step_s"]
    assert pair["median_ratio"] == pytest.approx(3.0 / 4.0)
    assert s["pairs"][f"{v} / {peer} : cpu_s"]["median_ratio"] == pytest.approx(4.0 / 6.0)
    targets = h.derived_targets(s, None, None)
    assert any(
        t.startswith(f"step (wall) {v} / {peer}") and "median 0.75" in t and t.endswith(": met")
        for t in targets
    )
    assert not any(t.startswith("step vs stock") for t in targets)
    slow = [step(v, k, 3.5, cpu_s=4.0) for k in range(3)] + [step(peer, k, 4.0) for k in range(3)]
    targets = h.derived_targets(h.summarize(slow, [v, peer], v), None, None)
    assert any(t.startswith("step (wall)") and t.endswith(": NOT met") for t in targets)


def test_limits_small():
    bw = stream_bandwidth(elems=1 << 20, repeats=3)
    assert bw.copy_gbs > 0 and bw.triad_gbs > 0 and len(bw.copy_samples_gbs) == 3
    import torch

    assert hit_bytes(torch.tensor([0, 3, 0, 1]), 100) == 200
    assert effective_bandwidth(2e9, 0.5) == pytest.approx(4.0)
    assert fraction_of(6.0, 12.0) == pytest.approx(0.5)
    assert effective_bandwidth(1.0, 0.0) == 0.0


def test_copy_probe_reuses_its_buffers_and_stays_finite():
    """A rotation's copy samples run on buffers allocated once (no per-sample allocation that
    re-faults pages and slows the next kernel call), and many samples keep the values finite (the
    triad a = b + 3c would overflow to inf after ~20 samples without the reset)."""
    import torch
    from npu_lora.bench.limits import CopyProbe

    probe = CopyProbe(elems=1 << 16)
    ptrs = (probe.a.data_ptr(), probe.b.data_ptr(), probe.c.data_ptr())
    for _ in range(40):
        bw = probe.measure(repeats=3)
        assert bw.copy_gbs > 0 and bw.triad_gbs > 0 and len(bw.copy_samples_gbs) == 3
    assert (probe.a.data_ptr(), probe.b.data_ptr(), probe.c.data_ptr()) == ptrs
    assert all(torch.isfinite(t).all() for t in (probe.a, probe.b, probe.c))


def test_stream_variant_runs_fp32_router_on_bf16_weights_without_native_bf16():
    """A bf16 bench whose engine was built for ``grouped_mm``: switching a variant to
    ``npu_lora_stream`` switches the blocks to that kernel's compute dtype (fp32 router and
    activations where the CPU has no native bf16), and back to bf16 for the torch kernels."""
    from npu_lora.machine import cpu_capabilities
    from npu_lora.moe.experts import register

    register()  # as run_bench does for the variants' kernels
    cfg = h.BenchConfig(preset="tiny-qwen3-moe", seq_len=16, host_dtype="bfloat16", limits=False)
    engine = h._build_engine(cfg, False, lambda s: None)
    runner = h.VariantRunner(engine, cfg, None)
    want = torch.bfloat16 if cpu_capabilities()["native_bf16"] else torch.float32
    assert h.stream_compute_dtype(torch.bfloat16) == want
    assert h.stream_compute_dtype(torch.float32) == torch.float32
    runner.apply(h.Variant.parse("host-only+keep_graph@npu_lora_stream"))
    for m in engine.mlps:
        assert m.compute_dtype == want and m.gate.weight.dtype == want
        assert m.experts.gate_up_proj.dtype == torch.bfloat16
    runner.apply(h.Variant.parse("host-only+keep_graph"))  # the bench default, grouped_mm
    assert all(m.gate.weight.dtype == torch.bfloat16 for m in engine.mlps)
    batch = {"input_ids": torch.randint(0, 100, (1, 16)), "labels": torch.randint(0, 100, (1, 16))}
    runner.apply(h.Variant.parse("host-only+keep_graph@npu_lora_stream"))
    assert runner.step(h.Variant.parse("host-only+keep_graph@npu_lora_stream"), batch)["step_s"] > 0


def test_torch_head_variant_switches_the_cpu_head_off_the_stream_kernel():
    """``+torch_head`` computes the LM head with ``lm_head`` (torch's mm), the other variants with
    the backend's streaming kernel: same loss up to the summation order."""
    from npu_lora.moe import stream_linear

    cfg = h.BenchConfig(preset="tiny-qwen3-moe", seq_len=16, limits=False, answer_tokens=4)
    engine = h._build_engine(cfg, False, lambda s: None)
    runner = h.VariantRunner(engine, cfg, None)
    (batch,) = h.make_batches(1, batch=1, seq_len=16, vocab=100, answer_tokens=4, seed=0)
    losses = {}
    for name in ("host-only", "host-only+torch_head", "host-only"):
        v = h.Variant.parse(name)
        runner.apply(v)
        want = None if v.torch_head else stream_linear.frozen_linear
        assert engine.head.linear is want
        losses[name] = runner.step(v, batch)["loss"]
    assert abs(losses["host-only"] - losses["host-only+torch_head"]) < 1e-5


def test_fp32_peer_runs_stock_blocks_with_fp32_experts_on_a_bf16_engine():
    """``peer+fp32`` on a bf16 engine: the stock blocks run on an fp32 copy of the experts (the
    engine's bf16 weights untouched, the copy made once), the kernel named by the variant is the
    one that runs, and the loss is the stock bf16 peer's up to bf16 rounding of the experts."""
    cfg = h.BenchConfig(preset="tiny-qwen3-moe", seq_len=16, host_dtype="bfloat16", limits=False)
    engine = h._build_engine(cfg, False, lambda s: None)
    runner = h.VariantRunner(engine, cfg, None)
    (batch,) = h.make_batches(1, batch=1, seq_len=16, vocab=100, answer_tokens=4, seed=0)
    before = [m.experts.gate_up_proj.detach().clone() for m in engine.mlps]
    losses = {}
    for name in ("peer+fp32@grouped_mm", "peer@grouped_mm", "peer+fp32@eager"):
        v = h.Variant.parse(name)
        runner.apply(v)
        losses[name] = runner.step(v, batch)["loss"]
    copies = runner.fp32_blocks()
    assert runner.fp32_blocks() is copies  # made once
    for m, c, w in zip(engine.mlps, copies, before, strict=True):
        assert m.experts.gate_up_proj.dtype == torch.bfloat16
        assert torch.equal(m.experts.gate_up_proj.detach(), w)  # the engine's weights untouched
        assert c.experts.gate_up_proj.dtype == torch.float32
        assert torch.equal(c.experts.gate_up_proj.detach(), w.float())  # the same values
        assert c.experts.config is m.experts.config  # follows the variant's experts kernel
        assert c.experts.config._experts_implementation == "eager"
    # fp32 experts: grouped_mm and eager agree closely; the bf16 peer differs by bf16 rounding
    assert abs(losses["peer+fp32@grouped_mm"] - losses["peer+fp32@eager"]) < 1e-4
    assert abs(losses["peer+fp32@grouped_mm"] - losses["peer@grouped_mm"]) < 5e-2


def test_sdpa_peer_runs_stock_attention_on_sdpa_and_restores_eager(monkeypatch):
    """``peer+sdpa``: the stock model's attention goes through torch's
    ``scaled_dot_product_attention`` (transformers' default) for that step only; the eager peer
    and the engine's own steps never call it, the configs are back on ``eager`` after the step,
    and the loss is the eager peer's up to rounding."""
    cfg = h.BenchConfig(preset="tiny-qwen3-moe", seq_len=16, limits=False)
    engine = h._build_engine(cfg, False, lambda s: None)
    runner = h.VariantRunner(engine, cfg, None)
    (batch,) = h.make_batches(1, batch=1, seq_len=16, vocab=100, answer_tokens=4, seed=0)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **kw):
        calls.append(a[0].shape)
        return sdpa(*a, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    losses, counts = {}, {}
    for name in ("peer@grouped_mm", "peer+sdpa@grouped_mm", "host-only+keep_graph"):
        v = h.Variant.parse(name)
        runner.apply(v)
        before = len(calls)
        losses[name] = runner.step(v, batch)["loss"]
        counts[name] = len(calls) - before
    layers = int(engine.config.num_hidden_layers)
    assert counts == {
        "peer@grouped_mm": 0,
        "peer+sdpa@grouped_mm": layers,
        "host-only+keep_graph": 0,
    }
    impls = {
        getattr(m.config, "_attn_implementation", None)
        for m in engine.model.modules()
        if getattr(m, "config", None) is not None
    }
    assert impls == {"eager"}
    assert abs(losses["peer+sdpa@grouped_mm"] - losses["peer@grouped_mm"]) < 1e-4
    assert abs(losses["host-only+keep_graph"] - losses["peer@grouped_mm"]) < 1e-4


def test_fp32_variant_runs_our_engine_on_fp32_experts_in_the_same_process():
    """``host-only+fp32`` on a bf16 engine: that variant's steps run on the fp32 copy of the
    experts (twice the bytes counted, the fp32 peer's loss), the next variant on the engine's own
    bf16 tensors again (same storage, same loss as before)."""
    cfg = h.BenchConfig(preset="tiny-qwen3-moe", seq_len=16, host_dtype="bfloat16", limits=False)
    engine = h._build_engine(cfg, False, lambda s: None)
    runner = h.VariantRunner(engine, cfg, None)
    (batch,) = h.make_batches(1, batch=1, seq_len=16, vocab=100, answer_tokens=4, seed=0)
    own = [m.experts.gate_up_proj.data.data_ptr() for m in engine.mlps]
    recs = {}
    for name in (
        "host-only+keep_graph@npu_lora_stream",
        "host-only+keep_graph+fp32@npu_lora_stream",
        "peer+fp32@grouped_mm",
        "host-only+keep_graph@npu_lora_stream",
    ):
        v = h.Variant.parse(name)
        runner.apply(v)
        want = torch.float32 if v.fp32 and not v.is_peer else torch.bfloat16
        assert all(m.experts.gate_up_proj.dtype == want for m in engine.mlps)
        assert all(m.experts.down_proj.dtype == want for m in engine.mlps)
        recs.setdefault(name, []).append(runner.step(v, batch))
    bf16, fp32 = (
        recs["host-only+keep_graph@npu_lora_stream"],
        recs["host-only+keep_graph+fp32@npu_lora_stream"],
    )
    assert [m.experts.gate_up_proj.data.data_ptr() for m in engine.mlps] == own
    assert bf16[0]["loss"] == bf16[1]["loss"]  # back on the same bf16 weights
    assert fp32[0]["host_hit_bytes"] == 2 * bf16[0]["host_hit_bytes"] > 0
    assert abs(fp32[0]["loss"] - recs["peer+fp32@grouped_mm"][0]["loss"]) < 1e-4
    assert fp32[0]["loss"] != bf16[0]["loss"]


def test_4k_variant_runs_our_engine_on_copies_outside_the_placed_pages(monkeypatch):
    """``+4k`` (and ``+fp32+4k``): that variant's steps run on copies of the expert tensors in
    the allocator's memory (other storage, same values, so the same loss), the next variant on
    the engine's own placed tensors again."""
    from npu_lora.moe import pages
    from npu_lora.moe.experts import register

    register()  # as run_bench does for the variants' kernels (the test runs alone too)
    monkeypatch.setattr(pages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(pages, "huge_page_bytes", lambda: 4096)  # place the tiny experts too
    cfg = h.BenchConfig(preset="tiny-qwen3-moe", seq_len=16, host_dtype="bfloat16", limits=False)
    engine = h._build_engine(cfg, False, lambda s: None)
    assert engine.experts_pages["placed_tensors"] == 2 * len(engine.mlps)
    runner = h.VariantRunner(engine, cfg, None)
    (batch,) = h.make_batches(1, batch=1, seq_len=16, vocab=100, answer_tokens=4, seed=0)
    own = [m.experts.gate_up_proj.data.data_ptr() for m in engine.mlps]
    fp32_ptrs = None
    recs, ptrs = {}, {}
    for name in (
        "host-only+keep_graph@npu_lora_stream",
        "host-only+keep_graph+4k@npu_lora_stream",
        "host-only+keep_graph+fp32@npu_lora_stream",
        "host-only+keep_graph+fp32+4k@npu_lora_stream",
        "host-only+keep_graph+4k@npu_lora_stream",
        "host-only+keep_graph@npu_lora_stream",
    ):
        v = h.Variant.parse(name)
        runner.apply(v)
        now = [m.experts.gate_up_proj.data.data_ptr() for m in engine.mlps]
        ptrs.setdefault(name, set()).add(tuple(now))
        if name == "host-only+keep_graph+fp32@npu_lora_stream":
            fp32_ptrs = now
        recs.setdefault(name, []).append(runner.step(v, batch)["loss"])
    bf16, bf16_4k = (
        ptrs["host-only+keep_graph@npu_lora_stream"],
        ptrs["host-only+keep_graph+4k@npu_lora_stream"],
    )
    assert bf16 == {tuple(own)} and len(bf16_4k) == 1  # the same copies every time
    assert not set(own) & set(next(iter(bf16_4k)))
    fp32_4k = ptrs["host-only+keep_graph+fp32+4k@npu_lora_stream"]
    assert not set(fp32_ptrs) & set(next(iter(fp32_4k)))
    assert len(set(recs["host-only+keep_graph@npu_lora_stream"])) == 1
    assert (
        recs["host-only+keep_graph+4k@npu_lora_stream"]
        == recs["host-only+keep_graph@npu_lora_stream"]
    )
    assert (
        recs["host-only+keep_graph+fp32+4k@npu_lora_stream"]
        == recs["host-only+keep_graph+fp32@npu_lora_stream"]
    )
    assert (
        recs["host-only+keep_graph+fp32@npu_lora_stream"]
        != recs["host-only+keep_graph@npu_lora_stream"]
    )
    assert all(m.experts.gate_up_proj.dtype == torch.bfloat16 for m in engine.mlps)


def test_bench_tiny_end_to_end(tmp_path, monkeypatch):
    """Table, JSONL and PNG are written; rounds alternate the order; all variants share weights."""
    from npu_lora.moe import experts as ex

    calls = []
    real = ex.build_routing
    monkeypatch.setattr(ex, "build_routing", lambda *a: calls.append(1) or real(*a))
    out = tmp_path / "bench"
    cfg = h.BenchConfig(
        preset="tiny-qwen3-moe",
        seq_len=16,
        rounds=2,
        steps_per_round=2,
        hot_warmup_steps=1,
        variants=[
            "host-only",
            "host-only+keep_graph",
            "hot+keep_graph",
            "host-only+keep_graph@npu_lora_sorted",
        ],
        peers=True,
        peer_impls=["grouped_mm"],
        limits=False,
        out=str(out),
    )
    summary = h.run_bench(cfg, log=lambda s: None)
    assert (out / "bench.md").read_text().count("| host-only") >= 2
    assert (out / "bench.png").stat().st_size > 1000
    recs = [json.loads(line) for line in (out / "bench.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in recs}
    assert {"meta", "step", "summary", "hot", "memory", "engine", "round"} <= kinds
    rounds = [r for r in recs if r["kind"] == "round"]  # load and disturbance of every round
    assert [r["round"] for r in rounds] == list(range(cfg.rounds))
    assert all(r["loadavg1"] >= 0 and r["wall_s"] > 0 and "disturbed" in r for r in rounds)
    (built,) = [r for r in recs if r["kind"] == "engine"]  # the engine's resolved host side
    assert built["host"]["dtype"] == "float32" and "placed_tensors" in built["experts_pages"]
    steps = [r for r in recs if r["kind"] == "step"]
    names = [*cfg.variants, "peer@grouped_mm"]
    assert len(steps) == len(names) * cfg.rounds * cfg.steps_per_round
    for k in range(cfg.rounds):
        seq = [r["variant"] for r in steps if r["round"] == k and r["step_in_round"] == 0]
        assert seq == (names if k % 2 == 0 else names[::-1])
    # same weights, same batches: every variant's loss for the same batch is the same
    losses = {(r["variant"], r["step_in_round"]): r["loss"] for r in steps if r["round"] == 0}
    for s in range(cfg.steps_per_round):
        vals = [losses[(v, s)] for v in names]
        assert max(vals) - min(vals) < 1e-4, vals
    by = {r["variant"]: r for r in steps if r["round"] == 0 and r["step_in_round"] == 0}
    assert by["host-only"]["recompute_s"] > 0 and by["host-only+keep_graph"]["recompute_s"] == 0
    assert by["hot+keep_graph"]["device_calls_per_layer"] == 2
    assert by["host-only"]["device_calls_per_layer"] == 1
    assert by["hot+keep_graph"]["host_hit_bytes"] < by["host-only"]["host_hit_bytes"]
    assert set(summary["medians"]) == set(names)
    assert not math.isnan(summary["medians"]["peer@grouped_mm"]["step_s"])
    assert any("peer@grouped_mm" in t for t in summary["targets"])
    # the @npu_lora_sorted variant really ran our kernel (2 layers x steps), the others did not
    n_sorted = (cfg.warmup + cfg.rounds * cfg.steps_per_round) * 2
    assert (
        len(calls) == n_sorted + 1
    )  # + the kept-graph memory measurement with that kernel (layer 0)


def test_cli_bench(tmp_path, capsys):
    """`npu-lora bench` with no kernel/dtype flags measures what `npu-lora run` runs by default
    (moe.expertsKernel, moe.hostDtype auto resolved for this CPU) and says so in its header."""
    from npu_lora.api.v1alpha1.sections import MoESpec
    from npu_lora.cli import main

    out = tmp_path / "cli"
    rc = main(
        [
            "bench",
            "--seq-len",
            "16",
            "--rounds",
            "2",
            "--variants",
            "host-only,host-only+keep_graph",
            "--no-peers",
            "--no-limits",
            "--no-memory",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert (
        (out / "bench.md").exists()
        and (out / "bench.png").exists()
        and (out / "bench.jsonl").exists()
    )
    (header,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("bench runs:")]
    kernel = MoESpec.model_fields["experts_kernel"].default
    assert header.startswith(f"bench runs: experts kernel {kernel} (")
    assert "(auto: " in header and header.endswith("what `npu-lora run` runs by default")


def test_bench_header_names_what_differs_from_run():
    cfg = h.BenchConfig(experts_impl="grouped_mm", host_dtype="float32", threads=1)
    got, header = h.resolve_run_defaults(cfg)
    assert got.host_dtype == "float32" and "experts kernel grouped_mm (run: " in header
    assert "host dtype float32 (run: auto)" in header and "threads 1" in header
    auto, line = h.resolve_run_defaults(h.BenchConfig(experts_impl="grouped_mm", host_dtype="auto"))
    assert (
        auto.host_dtype in ("float32", "bfloat16")
        and f"host dtype {auto.host_dtype} (auto:" in line
    )


def test_weight_copies_are_sized_per_copy_and_shared_between_fp32_variants():
    """``copy_bytes``: the fp32 copy is counted once for ``+fp32`` and ``peer+fp32`` together (2x
    the bf16 experts), ``+4k`` adds a copy per storage dtype, variants without copies need none."""
    cfg = h.BenchConfig(preset="tiny-qwen3-moe", seq_len=16, host_dtype="bfloat16", limits=False)
    engine = h._build_engine(cfg, False, lambda s: None)
    stored = sum(m.experts.gate_up_proj.nbytes + m.experts.down_proj.nbytes for m in engine.mlps)
    assert stored > 0 and engine.mlps[0].experts.gate_up_proj.dtype == torch.bfloat16
    parse = h.Variant.parse
    assert h.copy_bytes(engine, [parse("host-only+keep_graph"), parse("peer@grouped_mm")]) == {}
    need = h.copy_bytes(engine, [parse("host-only+fp32"), parse("peer+fp32@grouped_mm")])
    assert list(need.values()) == [2 * stored]
    need = h.copy_bytes(
        engine, [parse("host-only+4k"), parse("host-only+fp32+4k"), parse("peer+fp32")]
    )
    assert sorted(need.values()) == [stored, 2 * stored, 2 * stored]


def test_bench_refuses_weight_copies_that_do_not_fit_before_making_them(tmp_path, monkeypatch):
    """More copy bytes than 90 % of the memory available: a ValueError naming the variants, the
    GiB needed and the limit's source, before any copy exists (no rounds run); the CLI exits 2
    with it; ``NPU_LORA_MEMORY_LIMIT=none`` skips the check."""
    made = []
    monkeypatch.setattr(h.VariantRunner, "fp32_blocks", lambda self: made.append(1) or [])
    monkeypatch.setenv("NPU_LORA_MEMORY_LIMIT", "1Ki")
    cfg = h.BenchConfig(
        preset="tiny-qwen3-moe",
        seq_len=16,
        rounds=1,
        host_dtype="bfloat16",
        variants=["host-only+keep_graph", "host-only+keep_graph+fp32"],
        peers=False,
        limits=False,
        memory=False,
        out=str(tmp_path / "b"),
    )
    with pytest.raises(ValueError) as e:
        h.run_bench(cfg, log=lambda s: None)
    msg = str(e.value)
    assert "host-only+keep_graph+fp32" in msg and "GiB" in msg and "NPU_LORA_MEMORY_LIMIT" in msg
    assert made == []
    from npu_lora.cli import main

    argv = ["bench", "--seq-len", "16", "--rounds", "1", "--host-dtype", "bf16", "--no-peers"]
    argv += ["--variants", "host-only,host-only+fp32", "--no-limits", "--no-memory"]
    assert main([*argv, "--out", str(tmp_path / "c")]) == 2
    monkeypatch.setenv("NPU_LORA_MEMORY_LIMIT", "none")
    assert h.available_bytes() == (None, "NPU_LORA_MEMORY_LIMIT")


def test_engine_is_built_for_the_first_variants_kernel(tmp_path, monkeypatch):
    """The bench builds its engine for the kernel its (first) own variant runs, not the bench
    default, so the build's hostDtype resolution and warnings are those of what is measured."""
    built = []
    real = h._build_engine
    monkeypatch.setattr(
        h,
        "_build_engine",
        lambda cfg, hot, log, impl=None: built.append(impl) or real(cfg, hot, log, impl),
    )
    for variants, want in (
        (["host-only+keep_graph@npu_lora_stream", "peer+fp32@grouped_mm"], "npu_lora_stream"),
        (["peer@eager", "host-only"], "grouped_mm"),
    ):
        cfg = h.BenchConfig(
            seq_len=16, rounds=1, variants=variants, peers=False, limits=False, memory=False,
            out=str(tmp_path / want),
        )  # fmt: skip
        h.run_bench(cfg, log=lambda s: None)
        assert built.pop() == want


def test_cli_bad_variant(tmp_path, capsys):
    from npu_lora.cli import main

    rc = main(["bench", "--variants", "warp-drive", "--no-limits", "--out", str(tmp_path)])
    assert rc == 2


def test_kernels_bench_tiny(tmp_path):
    from npu_lora.bench.kernels import bench_kernels

    rows = bench_kernels(
        tokens=[16],
        dtypes=["float32"],
        impls=["copy", "eager", "grouped_mm", "npu_lora_sorted"],
        rounds=2,
        H=32,
        inter=16,
        E=8,
        K=2,
        train_experts=True,
        out=tmp_path,
        log=lambda s: None,
        bw_elems=1 << 18,
    )
    assert {(r["impl"], r["mode"]) for r in rows} == {
        (i, m) for i in ("eager", "grouped_mm", "npu_lora_sorted") for m in ("frozen", "train")
    }
    assert all(r["rounds"] == 2 and r["fwd_ms"] > 0 for r in rows)
    assert all(r["copy_gbs"] > 0 and r["fwd_of_copy"] > 0 for r in rows)  # copy in the rotation
    assert "| 16 | float32 | frozen | npu_lora_sorted |" in (tmp_path / "kernels.md").read_text()
    recs = [json.loads(line) for line in (tmp_path / "kernels.jsonl").read_text().splitlines()]
    assert recs[0]["kind"] == "machine" and "isa" in recs[0]["cpu_capabilities"]
    # where the weights sat, per module (the engine's placement rule; these are too small)
    placed = [(r["dtype"], r["mode"], r["placed_tensors"]) for r in recs if r["kind"] == "pages"]
    assert placed == [("float32", "frozen", 0), ("float32", "train", 0)]


def test_kernels_bench_runs_a_forced_isa_per_impl(tmp_path, monkeypatch):
    """``npu_lora_stream@<isa>`` runs that instruction-set path for its calls only: the forced
    path reaches the kernel (one the CPU cannot run is refused by name), rows are kept apart by
    the full name, and the environment is restored afterwards."""
    from npu_lora.bench.kernels import bench_kernels
    from npu_lora.moe import kernels

    monkeypatch.delenv("NPU_LORA_STREAM_ISA", raising=False)
    if kernels.load() is None:
        pytest.skip("stream extension unavailable here")
    args = dict(tokens=[16], dtypes=["bfloat16"], rounds=1, H=32, inter=16, E=8, K=2,
                out=tmp_path, log=lambda s: None, bw_elems=1 << 18)  # fmt: skip
    rows = bench_kernels(impls=["npu_lora_stream", "npu_lora_stream@base"], **args)
    assert {r["impl"] for r in rows} == {"npu_lora_stream", "npu_lora_stream@base"}
    assert "NPU_LORA_STREAM_ISA" not in os.environ
    with pytest.raises(ValueError, match="NPU_LORA_STREAM_ISA='neon'"):
        bench_kernels(impls=["npu_lora_stream@neon"], **args)
    assert "NPU_LORA_STREAM_ISA" not in os.environ


def test_kernels_dtype_ab_tiny(tmp_path):
    from npu_lora.bench.kernels import bench_dtype_ab

    rows = bench_dtype_ab(
        tokens=[16], impl="npu_lora_stream", rounds=2, H=32, inter=16, E=8, K=2, out=tmp_path,
        log=lambda s: None,
    )  # fmt: skip
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"]
    assert rows[0]["fwd_s_vs_fp32"] == 1.0 and rows[1]["cpu_s"] > 0
    assert "| 16 | bfloat16 |" in (tmp_path / "dtype_ab.md").read_text()


def test_build_spec_from_manifest_and_preset():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    manifests = sorted((root / "examples").glob("*.yaml"))
    if manifests:
        cfg = h.BenchConfig(
            config=str(manifests[0]), preset=None, layers=1, seq_len=64, host_dtype="bfloat16"
        )
        spec = h.build_spec(cfg, placement="hot")
        assert spec.model.layers == 1 and spec.training.seq_len == 64
        assert spec.moe.placement == "hot" and spec.moe.host_dtype == "bfloat16"
    spec = h.build_spec(
        h.BenchConfig(preset="qwen3-30b-a3b", layers=2, threads=1), placement="host-only"
    )
    assert spec.model.preset == "qwen3-30b-a3b" and spec.model.layers == 2
    assert spec.moe.host_threads == 1 and spec.device.backend == "cpu"
