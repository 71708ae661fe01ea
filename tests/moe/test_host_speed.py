"""The host MoE block's thread policy (``moe.threads``), the engine-vs-kernel probe's verdict
line (``bench.host_layer``) and the roofline model and sweep (``moe.roofline``, ``bench.roofline``)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from npu_lora.api.v1alpha1 import LoraSpec, ModelSpec
from npu_lora.backends import CpuBackend
from npu_lora.bench.host_layer import ENGINE_VS_KERNEL, probe_lines
from npu_lora.models import build_model, moe_blocks
from npu_lora.moe import HostMLP, kernels, roofline, threads
from npu_lora.moe.kernels import ops


@pytest.fixture
def two_threads():
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


def test_small_ops_one_thread_kernel_all_and_restored(two_threads, monkeypatch):
    monkeypatch.delenv("NPU_LORA_HOST_SMALL_OPS", raising=False)
    seen = []
    with threads.small_ops():
        seen.append(torch.get_num_threads())
        with threads.small_ops():  # nested: still one, and the outer count is kept
            seen.append(torch.get_num_threads())
        with threads.kernel_threads():
            seen.append(torch.get_num_threads())
        seen.append(torch.get_num_threads())
    seen.append(torch.get_num_threads())
    with threads.kernel_threads():  # outside small_ops: nothing changes
        seen.append(torch.get_num_threads())
    assert seen == [1, 1, 2, 1, 2, 2]
    monkeypatch.setenv("NPU_LORA_HOST_SMALL_OPS", "0")
    with threads.small_ops():
        assert torch.get_num_threads() == 2
    with threads.small_ops(on=False):
        assert torch.get_num_threads() == 2


@pytest.mark.skipif(kernels.load() is None, reason="extension unavailable")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("keep", [True, False])
def test_host_mlp_stream_small_ops_bitwise_and_kernel_gets_all_threads(
    two_threads, monkeypatch, dtype, keep
):
    """Output and input gradient bitwise equal with the policy on and off; the kernel's two
    operators run with every thread, the router on one."""
    from npu_lora.moe.experts import register

    register()
    model, _ = build_model(
        ModelSpec(preset="tiny-qwen3-moe"),
        LoraSpec(),
        seed=0,
        host_dtype=dtype,
        experts_implementation="npu_lora_stream",
    )
    stock = moe_blocks(model)[0]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 64, generator=g)
    gy = torch.randn(2, 16, 64, generator=g)
    counts: dict[str, list[int]] = {"kernel": [], "router": []}
    fwd, bwd = ops.stream_forward, ops.stream_backward

    def spy(fn):
        def call(*a):
            counts["kernel"].append(torch.get_num_threads())
            return fn(*a)

        return call

    monkeypatch.setattr(ops, "stream_forward", spy(fwd))
    monkeypatch.setattr(ops, "stream_backward", spy(bwd))
    out = {}
    for on in ("1", "0"):
        monkeypatch.setenv("NPU_LORA_HOST_SMALL_OPS", on)
        mlp = HostMLP(copy.deepcopy(stock), layer=0, backend=CpuBackend(), keep_graph=keep)
        assert mlp.small_ops
        hook = mlp.gate.register_forward_hook(
            lambda *_: counts["router"].append(torch.get_num_threads())
        )
        xr = x.clone().requires_grad_(True)
        y = mlp(xr)
        y.backward(gy)
        hook.remove()
        out[on] = (y.detach(), xr.grad)
    assert torch.equal(out["1"][0], out["0"][0]) and torch.equal(out["1"][1], out["0"][1])
    assert set(counts["kernel"]) == {2}
    n_on = 1 if keep else 2  # recompute runs the router again in backward
    assert counts["router"][:n_on] == [1] * n_on and set(counts["router"][n_on:]) == {2}


def test_probe_line_is_the_median_of_per_round_ratios():
    summary = {
        "tokens": 128,
        "hit_experts": 120,
        "host_dtype": "bfloat16",
        "compute_dtype": "bfloat16",
        "threads": 2,
        "loadavg1": [1.0, 2.0, 1.5],
        "disturbed_rounds": [1],
        "ratios engine": {"fwd": {0: 1.0, 1: 1.3, 2: 1.1}, "bwd": {0: 1.2, 1: 1.25, 2: 1.3}},
        "ratios engine (all threads)": {"fwd": {0: 1.4, 1: 1.5, 2: 1.6}, "bwd": {0: 2, 1: 2, 2: 2}},
    }
    lines = probe_lines(summary)
    assert lines[0].startswith("host MoE engine/kernel per layer: fwd 1.10, bwd 1.25 (T=128")
    assert lines[1].endswith(": met") and "met in 2 of 3 rounds" in lines[1]
    assert lines[2].endswith(": NOT met") and f"target ≤ {ENGINE_VS_KERNEL:.2f}" in lines[2]
    assert "1 of 3 rounds disturbed" in lines[1]
    assert "fwd 1.50, bwd 2.00" in lines[3]
    assert "not measured (no x)" in probe_lines({"why": "no x"})[0]


def test_roofline_model():
    m = roofline.Machine(read_gbs=30.0, peak_gflops={"bfloat16": 600.0}, threads=2)
    assert roofline.expected_hit(1, 8, 128) == pytest.approx(8)
    assert roofline.expected_hit(4096, 8, 128) == pytest.approx(128)
    per = 3 * 2048 * 768 * 2  # one bf16 expert
    small = roofline.bound(None, roofline.pass_flops(64, 8, 2048, 768), 128 * per, m, "bfloat16")
    big = roofline.bound(None, roofline.pass_flops(8192, 8, 2048, 768), 128 * per, m, "bfloat16")
    assert small["bound"] == "bandwidth" and big["bound"] == "compute"
    assert small["ridge"] == pytest.approx(20.0)
    kw = {"K": 8, "E": 128, "H": 2048, "inter": 768, "expert_bytes": per, "m": m}
    # memory-bound: twice the tokens in one pass reads the same hit experts: ~2x tokens/s
    assert roofline.scaling(64, 2, dtype="bfloat16", **kw) == pytest.approx(2.0, rel=0.02)
    # compute-bound: no gain
    assert roofline.scaling(8192, 2, dtype="bfloat16", **kw) == pytest.approx(1.0)
    lines = roofline.tuning_lines(128, dtype="bfloat16", measured_s=0.05, **kw)
    assert "bandwidth-bound" in lines[0] and "of the roof" in lines[0] and "2×" in lines[1]
    assert "not measured" in roofline.tuning_lines(128, dtype="bfloat16", **{**kw, "m": None})[0]


def test_measured_scaling_reads_the_kernels_own_sweep_not_the_floor():
    """Where the kernel does not reach its roof, the floor's 2× gain is a ceiling: the tuning
    lines quote the measured sweep beside it, interpolated between measured T, and only where the
    sweep covers the widths, the dtype and both token counts."""
    per = 3 * 2048 * 768 * 2
    widths = {"H": 2048, "inter": 768, "E": 128, "K": 8}
    # the 2-core Zen 4 bf16 sweep (2026-12-04): fwd + bwd seconds per layer
    secs = {"64": 0.0716, "128": 0.0836, "256": 0.1145, "512": 0.1866}
    m = roofline.Machine(43.5, {"bfloat16": 860.0}, 2, "how", {"widths": widths,
                         "seconds": {"bfloat16": secs}})  # fmt: skip
    kw = {"K": 8, "E": 128, "H": 2048, "inter": 768, "m": m, "dtype": "bfloat16"}
    assert roofline.measured_seconds(128, **kw) == pytest.approx(0.0836)
    assert roofline.measured_scaling(128, 2, **kw) == pytest.approx(2 * 0.0836 / 0.1145)
    assert roofline.measured_scaling(64, 8, **kw) == pytest.approx(8 * 0.0716 / 0.1866)
    # log-log between 128 and 256: the geometric mean at the geometric middle
    mid = roofline.measured_seconds(181, **kw)
    assert 0.0836 < mid < 0.1145 and mid == pytest.approx((0.0836 * 0.1145) ** 0.5, rel=0.01)
    assert roofline.measured_scaling(128, 8, **kw) is None  # 1024 was not measured
    assert roofline.measured_scaling(128, 2, **{**kw, "dtype": "float32"}) is None
    assert roofline.measured_scaling(128, 2, **{**kw, "H": 4096}) is None
    lines = roofline.tuning_lines(128, expert_bytes=per, measured_s=0.04, **kw)
    floor = roofline.scaling(128, 2, expert_bytes=per, **kw)
    assert f"2×: {floor:.2f}×" in lines[1]
    assert "measured kernel sweep" in lines[2] and "2×: 1.46×, 4×: 1.79×" in lines[2]
    assert "8×" not in lines[2]  # outside the sweep: not extrapolated
    other = roofline.tuning_lines(128, expert_bytes=per, **{**kw, "H": 1024})
    assert "does not cover" in other[-1]


def test_roofline_save_load(tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_LORA_ROOFLINE", str(tmp_path / "r.json"))
    assert roofline.load() is None
    m = roofline.Machine(31.5, {"float32": 100.0}, 2, "how")
    roofline.save(m)
    assert roofline.load() == m
    sw = {"widths": {"H": 64, "inter": 32, "E": 8, "K": 2}, "seconds": {"float32": {"16": 0.1}}}
    roofline.save(roofline.Machine(31.5, {"float32": 100.0}, 2, "how", sw))
    assert roofline.load().sweep == sw


@pytest.mark.slow
@pytest.mark.skipif(kernels.load() is None, reason="extension unavailable")
def test_roofline_sweep_writes_table_and_png(tmp_path):
    from npu_lora.bench.roofline import run_roofline

    res = run_roofline(
        out=tmp_path, tokens=(16, 32), dtypes=("float32",), rounds=1, H=64, inter=32, E=8, K=2,
        log=lambda s: None, save_machine=False, peak_n=128,
    )  # fmt: skip
    assert [r["T"] for r in res["rows"]] == [16, 32]
    assert all(
        r["bound"] in ("bandwidth", "compute") and math.isfinite(r["fwd_s"]) for r in res["rows"]
    )
    assert (tmp_path / "roofline.png").stat().st_size > 1000
    assert "| float32 | 16 |" in (tmp_path / "roofline.md").read_text()
    sweep = res["machine"]["sweep"]
    assert sweep["widths"] == {"H": 64, "inter": 32, "E": 8, "K": 2}
    assert sweep["seconds"]["float32"] == {
        str(r["T"]): pytest.approx(r["fwd_s"] + r["bwd_s"]) for r in res["rows"]
    }


def test_run_summary_reports_tokens_per_pass_and_bound(tmp_path, monkeypatch):
    """``train.summary``: tokens per pass = tokens / micro-batches; the bound from the stored
    machine lines, or 'not measured' without them."""
    from npu_lora.api.v1alpha1 import MoEFinetuneSpec
    from npu_lora.engine import build_engine
    from npu_lora.train.summary import build_summary, timing_table

    spec = {
        "model": {"preset": "tiny-qwen3-moe"},
        "data": {"path": "example:jsonl-mini"},
        "moe": {"placement": "host-only", "hostDtype": "float32"},
        "training": {"seqLen": 32, "batchSize": 2, "steps": 3},
        "device": {"backend": "cpu"},
    }
    eng = build_engine(MoEFinetuneSpec.model_validate(spec))
    recs = [
        {"step": s, "tokens": 128, "micro_batches": 2, "host_fwd_s": 0.04, "hot_s": 0.0}
        for s in (1, 2, 3)
    ]
    monkeypatch.setenv("NPU_LORA_ROOFLINE", str(tmp_path / "r.json"))
    kw = {"name": "x", "total_steps": 3, "warmup_steps": 0, "hot": None, "status": "ok"}
    got = build_summary(recs, engine=eng, **kw)["host_moe_pass"]
    assert got["tokens_per_pass"] == 64
    assert got["host_fwd_s_per_layer"] == pytest.approx(0.04 / 2 / eng.num_layers)
    assert "not measured" in got["lines"][0]
    roofline.save(roofline.Machine(1.0, {"float32": 1e6}, 2))  # a tiny bandwidth: memory-bound
    summary = build_summary(recs, engine=eng, **kw)
    assert "bandwidth-bound" in summary["host_moe_pass"]["lines"][0]
    assert "tokens per pass: 64" in timing_table(summary)
