"""``npu-lora bench`` ``+int8`` / ``+fp8`` variants (issue 39 item 6): the grammar, the refusals,
one bench with bf16 and both 8-bit variants in one process, and the bf16 weights untouched."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from npu_lora.bench import harness as h
from npu_lora.bench.q8 import check_q8, q8_copy
from npu_lora.engine.hooks import Q8Weight
from npu_lora.models import quant

warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")

STREAM = "npu_lora_stream"
BF16, INT8, FP8 = (
    f"host-only+keep_graph@{STREAM}",
    f"host-only+keep_graph+int8@{STREAM}",
    f"host-only+keep_graph+fp8@{STREAM}",
)


def _cfg(**kw) -> h.BenchConfig:
    base = dict(
        preset="tiny-qwen3-moe",
        seq_len=16,
        host_dtype="bfloat16",
        experts_impl=STREAM,
        limits=False,
        memory=False,
        layer_probe=False,
        peers=False,
    )
    return h.BenchConfig(**{**base, **kw})


def test_int8_and_fp8_modifiers_name_their_format():
    assert h.Variant.parse("host-only+keep_graph+int8").q8 == quant.INT8
    assert h.Variant.parse(f"host-only+fp8@{STREAM}").q8 == quant.FP8
    assert h.Variant.parse("host-only+keep_graph").q8 is None


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("host-only+int8+fp8", r"'host-only\+int8\+fp8': \+int8 and \+fp8 exclude each other"),
        ("hot+keep_graph+int8", r"'hot\+keep_graph\+int8': \+int8 applies to host-only"),
        ("peer+fp8", r"'peer\+fp8': \+fp8 applies to host-only .*stock transformers"),
        ("host-only+fp32+int8", r"\+int8 and \+fp32 exclude each other"),
        ("host-only+4k+fp8", r"\+fp8 and \+4k exclude each other"),
    ],
)
def test_impossible_8bit_combinations_are_refused_naming_the_variant(name, why):
    with pytest.raises(ValueError, match=why):
        h.Variant.parse(name)


def test_8bit_variants_refuse_other_kernels_trained_experts_and_8bit_engines():
    cfg = _cfg()
    engine = h._build_engine(cfg, False, lambda s: None)
    own = engine.expert_weights()
    with pytest.raises(ValueError, match=r"host-only\+int8@grouped_mm.*npu_lora_stream kernel"):
        check_q8(engine, own, [h.Variant.parse("host-only+int8@grouped_mm")], STREAM)
    with pytest.raises(ValueError, match=r"'host-only\+int8'.*npu_lora_stream kernel only"):
        check_q8(engine, own, [h.Variant.parse("host-only+int8")], "grouped_mm")
    engine.modes.train_experts = True
    with pytest.raises(ValueError, match=r"host-only\+fp8@npu_lora_stream.*trainExperts"):
        check_q8(engine, own, [h.Variant.parse(f"host-only+fp8@{STREAM}")], STREAM)
    engine.modes.train_experts = False
    with pytest.raises(ValueError, match="already 8-bit"):
        check_q8(engine, q8_copy(own, quant.INT8), [h.Variant.parse(INT8)], STREAM)
    check_q8(engine, own, [h.Variant.parse(INT8), h.Variant.parse(FP8)], STREAM)  # fine


def test_bf16_weights_come_back_bit_for_bit_after_the_8bit_variants():
    from npu_lora.moe.experts import register

    register()
    cfg = _cfg()
    engine = h._build_engine(cfg, False, lambda s: None)
    runner = h.VariantRunner(engine, cfg, None)
    (batch,) = h.make_batches(1, batch=1, seq_len=16, vocab=100, answer_tokens=4, seed=0)
    own = [(gu.data_ptr(), gu.clone(), dn.clone()) for gu, dn in engine.expert_weights()]
    losses: dict[str, list[float]] = {}
    for name in (BF16, INT8, FP8, INT8, BF16):
        v = h.Variant.parse(name)
        runner.apply(v)
        ex = engine.mlps[0].experts
        want = {None: torch.bfloat16, quant.INT8: torch.int8, quant.FP8: torch.float8_e4m3fn}
        assert ex.gate_up_proj.dtype == ex.down_proj.dtype == want[v.q8]
        assert quant.is_quantized(ex) == (v.q8 is not None)
        losses.setdefault(name, []).append(runner.step(v, batch)["loss"])
    for m, (ptr, gu, dn) in zip(engine.mlps, own, strict=True):
        ex = m.experts
        assert ex.gate_up_proj.data_ptr() == ptr
        assert torch.equal(ex.gate_up_proj.view(torch.int16), gu.view(torch.int16))
        assert torch.equal(ex.down_proj.view(torch.int16), dn.view(torch.int16))
        assert "gate_up_proj_scale" not in ex._buffers and not hasattr(ex, "quant_block")
    assert losses[BF16][0] == losses[BF16][1]  # the same weights, the same loss
    assert losses[INT8][0] == losses[INT8][1]  # one 8-bit copy, made once
    assert losses[INT8][0] != losses[BF16][0] and losses[FP8][0] != losses[BF16][0]
    copy = runner.q8_weights(quant.INT8)
    assert runner.q8_weights(quant.INT8) is copy and isinstance(copy[0][0], Q8Weight)


def test_one_bench_runs_bf16_int8_fp8_paired_with_8bit_reads_and_layer_errors(tmp_path):
    cfg = _cfg(variants=[BF16, INT8, FP8], rounds=1, out=str(tmp_path))
    summary = h.run_bench(cfg, log=lambda s: None)
    recs = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    steps = {r["variant"]: r for r in recs if r["kind"] == "step"}
    assert set(steps) == {BF16, INT8, FP8}
    assert all(r["round"] == 0 for r in steps.values())  # paired: one round, all three
    hits = steps[BF16]["host_hit_experts"]
    assert hits > 0 and steps[INT8]["host_hit_experts"] == steps[FP8]["host_hit_experts"] == hits
    bf16_bytes = steps[BF16]["host_hit_bytes"]
    for name in (INT8, FP8):  # one byte a weight plus fp32 scales: a little over half
        assert bf16_bytes / 2 < steps[name]["host_hit_bytes"] < 0.6 * bf16_bytes
    errors = [r for r in recs if r["kind"] == "q8_error"]
    assert summary["q8_errors"] == errors
    assert len(errors) == 4 and {e["layer"] for e in errors} == {0, 1}  # the tiny's 2 layers
    assert {e["variant"] for e in errors} == {INT8, FP8}
    bound = {INT8: 0.03, FP8: 0.1}  # quantisation error: int8 ~1 %, e4m3 ~5 %
    for e in errors:
        assert e["reference"] == "bfloat16"
        for part in ("out", "dx"):
            for k in ("max_rel", "rms_rel"):
                assert 0 < e[part][k] < bound[e["variant"]], (e["variant"], part, k, e[part][k])
    md = (tmp_path / "bench.md").read_text()
    assert "| variant | layer | out max | out RMS | dX max | dX RMS |" in md
    assert f"| {INT8} | 0 |" in md and f"| {FP8} | 1 |" in md


def test_peak_rss_of_an_8bit_variant_builds_the_8bit_engine_as_run_does(monkeypatch):
    """``--peak-rss`` measures ``+int8`` in a process whose engine is built with ``moe.hostDtype
    int8`` (quantised at load, as ``npu-lora run`` holds it), not a bf16 engine plus a copy."""
    from npu_lora.bench import peak_rss
    from npu_lora.engine import build as engine_build

    built: list[str] = []
    real = engine_build.build_engine

    def spy(spec, *a, **kw):
        built.append(spec.moe.host_dtype)
        return real(spec, *a, **kw)

    monkeypatch.setattr("npu_lora.engine.build_engine", spy)
    monkeypatch.setattr(peak_rss, "_reset_hwm", lambda: False)
    rec = peak_rss.child(_cfg(answer_tokens=4), INT8)
    assert built == [quant.INT8] and rec["variant"] == INT8 and rec["steps"] == 1
