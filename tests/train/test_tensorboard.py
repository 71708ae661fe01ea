"""TensorBoard event files of ``npu-lora run``, read back with TensorBoard's own reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from npu_lora.api import record as step_record
from npu_lora.cli import main
from npu_lora.train.tensorboard import TAGS, scalars, tag_of
from train_helpers import records, tiny_manifest

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _load(run_dir: Path):
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_tags_follow_the_step_record():
    timing = [
        c.name
        for c in step_record.RECORD
        if c.unit == "s" and c.kind == "float" and not c.data_parallel
    ]
    assert {"step_s", "attn_head_s", "host_fwd_s", "host_bwd_s", "recompute_s"} <= set(timing)
    for name in timing:
        assert f"time/{name}" in TAGS
    for tag in ("train/loss", "train/lr", "throughput/tokens_per_s", "moe/hot_experts"):
        assert tag in TAGS
    # bools, strings and the step itself are no scalars
    for name in ("keep_graph", "placement", "time", "step"):
        assert tag_of(step_record.by_name(name)) is None
    # the data-parallel columns under dist/ (the per-rank list is no scalar)
    assert tag_of(step_record.by_name("skew_s")) == "dist/skew_s" and "dist/skew_s" in TAGS
    assert tag_of(step_record.by_name("rank_compute_s")) is None
    # a byte-counting column (the traffic columns) lands under traffic/
    col = step_record.Column("h2d_bytes", "int", "bytes", "bytes moved host→device")
    assert tag_of(col) == "traffic/h2d_bytes"
    # non-finite and missing values are left out; throughput is derived
    s = scalars({"step": 1, "loss": None, "step_s": 0.5, "tokens": 100, "grad_norm": float("inf")})
    assert s == {"time/step_s": 0.5, "moe/tokens": 100.0, "throughput/tokens_per_s": 200.0}


def test_run_writes_event_files_tensorboard_reads(tmp_path, standin):
    cfg = tiny_manifest(tmp_path, training={"steps": 6}, checkpoint={"everySteps": 3})
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot"]) == 0
    assert list(out.glob("events.out.tfevents.*"))
    acc = _load(out)
    tags = set(acc.Tags()["scalars"])
    expected = {
        "train/loss",
        "train/lr",
        "throughput/tokens_per_s",
        "moe/hot_experts",
        "moe/hot_set_size",
        *(f"time/{c}" for c in step_record.TABLE_COLUMNS if step_record.by_name(c).unit == "s"),
    }
    assert expected <= tags, expected - tags
    recs = records(out)
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [r["step"] for r in recs] == list(range(1, 7))
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in recs], rel=1e-6)
    tps = acc.Scalars("throughput/tokens_per_s")
    assert tps[-1].value == pytest.approx(recs[-1]["tokens"] / recs[-1]["step_s"], rel=1e-5)
    hot = acc.Scalars("moe/hot_experts")
    assert hot[0].value == 0 and hot[-1].value == recs[-1]["hot_experts"] > 0
    assert "config/text_summary" in acc.Tags()["tensors"]

    # a longer rerun resumes: the steps after the checkpoint are not doubled in TensorBoard
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot", "--steps", "8"]) == 0
    loss = _load(out).Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 9))


def test_no_tensorboard_flag(tmp_path, standin):
    cfg = tiny_manifest(tmp_path, training={"steps": 2}, moe={"placement": "host-only"})
    out = tmp_path / "run"
    assert (
        main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot", "--no-tensorboard"]) == 0
    )
    assert not list(out.glob("events.out.tfevents.*"))


def test_eval_scalars_at_the_eval_steps(tmp_path, standin):
    cfg = tiny_manifest(
        tmp_path,
        training={"steps": 4},
        moe={"placement": "host-only"},
        eval={"fraction": 0.05, "everySteps": 2, "maxExamples": 4},
    )
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot"]) == 0
    acc = _load(out)
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    for key in ("loss", "perplexity", "accuracy", "seconds"):
        got = acc.Scalars(f"eval/{key}")
        assert [e.step for e in got] == [2, 4]
        assert [e.value for e in got] == pytest.approx([e[key] for e in evals], rel=1e-5)
