"""``moe.hostDtype: int8 | float8_e4m3fn``: the spec's rules, the memory estimate, and a tiny run
that trains with hot experts, resumes, records its host dtype and layout per step, chats on and
exports 8-bit host experts."""

from __future__ import annotations

import io
import json
import sys

import pytest
from npu_lora.api.load import load_manifest
from npu_lora.api.memory import estimate, text_config
from pydantic import ValidationError
from testkit import REPO
from train_helpers import records, run_in_process, tiny_manifest

Q8 = ["int8", "float8_e4m3fn"]


@pytest.mark.parametrize("dtype", Q8)
def test_train_experts_with_8bit_is_refused(tmp_path, dtype):
    cfg = tiny_manifest(
        tmp_path, moe={"placement": "host-only", "hostDtype": dtype}, lora={"trainExperts": True}
    )
    with pytest.raises((ValidationError, ValueError), match="frozen and quantised"):
        load_manifest(cfg)


def test_8bit_needs_the_stream_kernel(tmp_path):
    cfg = tiny_manifest(tmp_path, moe={"hostDtype": "int8", "expertsKernel": "grouped_mm"})
    with pytest.raises((ValidationError, ValueError), match="npu_lora_stream"):
        load_manifest(cfg)


@pytest.mark.parametrize("dtype", Q8)
def test_memory_auto_sizes_8bit_experts(dtype):
    """Qwen3-30B-A3B (examples/qwen3-30b-a3b-nsmc.yaml): 8-bit experts at most 55 % of bf16."""
    spec = load_manifest(REPO / "examples" / "qwen3-30b-a3b-nsmc.yaml").spec
    cfg = text_config(
        json.loads((REPO / ".." / "shared" / "data" / "qwen3-30b-a3b" / "config.json").read_text())
        if (REPO / ".." / "shared" / "data" / "qwen3-30b-a3b" / "config.json").is_file()
        else json.loads(
            (REPO / "worker" / "npu_lora" / "models" / "configs" / "qwen3-30b-a3b.json").read_text()
        ),
        spec.model.layers,
    )
    bf16 = estimate(spec, cfg, 0, "bfloat16")
    q8 = estimate(spec, cfg, 0, dtype)
    assert q8.host_dtype == dtype
    assert q8.total <= 0.55 * bf16.total
    # the experts' bytes: 1 per weight + fp32 scales (int8: per row; fp8: per 128 x 128 block)
    L, E, H, inter = 48, 128, 2048, 768
    if spec.model.layers:
        L = spec.model.layers
    assert q8.weights >= L * E * 3 * H * inter


@pytest.mark.parametrize("dtype", Q8)
def test_tiny_run_trains_resumes_chats_and_exports(tmp_path, dtype, monkeypatch, capsys):
    cfg = tiny_manifest(
        tmp_path,
        moe={"placement": "hot", "warmupSteps": 2, "hostDtype": dtype},
        training={"steps": 6},
        checkpoint={"everySteps": 2},
    )
    out = tmp_path / "run"
    assert run_in_process(cfg, out, "--steps", "4") == 0
    assert run_in_process(cfg, out) == 0  # resumes from step 4
    recs = records(out)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert all(r["loss"] == r["loss"] for r in recs)  # no NaN
    summary = json.loads((out / "summary.json").read_text())
    host = summary["machine"]["host"]
    assert host["dtype"] == dtype
    assert host["layout"].startswith(dtype)
    # the per-step record says which dtype and layout ran (DESIGN §5), as summary/status do
    assert {(r["expert_dtype"], r["expert_layout"]) for r in recs} == {(dtype, host["layout"])}
    assert summary["hot"]  # hot experts were copied to the (cpu) device, dequantised

    import npu_lora.engine as engine_pkg
    from npu_lora.cli import main

    # chat: the inference load path (shared with predict and export) on the 8-bit engine
    built = []
    real_build = engine_pkg.build_engine

    def spy(*a, **k):
        built.append(real_build(*a, **k))
        return built[-1]

    monkeypatch.setattr(engine_pkg, "build_engine", spy)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("hello\n좋은 영화\n".encode())))
    capsys.readouterr()
    assert main(["chat", str(out), "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.count("\n") == 2  # one reply line per input line
    assert [e.host_choice.dtype for e in built] == [dtype]
    monkeypatch.undo()

    merged = tmp_path / "merged"
    assert main(["export", str(out), "--merged", str(merged), "--verify"]) == 0
    from safetensors import safe_open

    with safe_open(str(merged / "model.safetensors"), "pt") as f:
        dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys() if "experts" in k}  # noqa: SIM118 (a safe_open handle)
    assert dtypes == {"F32"}  # a preset exports in float32, dequantised
    # --dtype picks the dequantised experts' dtype; there is no 8-bit export (no --dequantize:
    # docs/engine.md), so argparse refuses that flag with exit 2 and writes nothing
    half = tmp_path / "merged-bf16"
    assert main(["export", str(out), "--merged", str(half), "--dtype", "bfloat16"]) == 0
    with safe_open(str(half / "model.safetensors"), "pt") as f:
        dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys() if "experts" in k}  # noqa: SIM118 (a safe_open handle)
    assert dtypes == {"BF16"}
    nope = tmp_path / "merged-q8"
    with pytest.raises(SystemExit) as exc:
        main(["export", str(out), "--merged", str(nope), "--dequantize"])
    assert exc.value.code == 2
    assert not nope.exists()
