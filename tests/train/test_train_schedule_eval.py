"""training.epochs / scheduler / warm-up and spec.eval in the loop: the schedule's learning
rates, resume restores the schedule and the best eval loss exactly, eval never changes
training, held-out rows are never trained on."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from npu_lora.api.load import SpecError, load_manifest
from npu_lora.api.v1alpha1 import TrainingSpec
from npu_lora.cli import main
from npu_lora.data.readers import Example
from npu_lora.evaluate.heldout import split_held_out
from npu_lora.train.rundir import read_metrics
from safetensors.torch import load_file
from train_helpers import cli_cmd, cli_env, run_cli, tiny_manifest

NSMC_MINI = Path(__file__).resolve().parents[2] / "worker/npu_lora/data/examples/nsmc-mini.tsv"


def _eval_file(tmp_path: Path, rows: int = 24) -> Path:
    lines = NSMC_MINI.read_text(encoding="utf-8").splitlines()
    p = tmp_path / "heldout.tsv"
    p.write_text("\n".join([lines[0], *lines[-rows:]]) + "\n", encoding="utf-8")
    return p


# ----------------------------------------------------------------------------- spec (fast)


def test_steps_default_100_and_exclusive_with_epochs_naming_the_field(tmp_path):
    assert TrainingSpec().steps == 100 and TrainingSpec(epochs=2).steps is None
    assert TrainingSpec(epochs=2).epochs == 2
    cfg = tiny_manifest(tmp_path, training={"steps": 5, "epochs": 1})
    with pytest.raises(SpecError, match=r"spec\.training\.epochs: exclusive with training\.steps"):
        load_manifest(str(cfg))
    cfg = tiny_manifest(tmp_path, training={"warmupRatio": 0.1, "warmupSteps": 2})
    with pytest.raises(SpecError, match=r"spec\.training\.warmupSteps: exclusive with"):
        load_manifest(str(cfg))
    # --steps replaces epochs
    cfg = tiny_manifest(tmp_path, training={"steps": None, "epochs": 1})
    m = load_manifest(str(cfg), ["training.steps=7", "training.epochs=null"])
    assert m.spec.training.steps == 7 and m.spec.training.epochs is None


def test_epochs_give_steps_from_examples_batch_accumulation_and_ranks():
    t = TrainingSpec(epochs=2, batchSize=4, gradAccumulation=2)
    assert t.total_steps(80) == 20 and t.total_steps(81) == 21 and t.total_steps(80, world=2) == 10
    assert TrainingSpec(epochs=0.5, batchSize=3).total_steps(10) == 2
    assert TrainingSpec(steps=9).total_steps(10_000) == 9
    assert TrainingSpec(warmupRatio=0.1).warmup_for(25) == 3
    assert TrainingSpec(warmupSteps=50).warmup_for(25) == 25
    assert TrainingSpec().warmup_for(25) == 0


def test_held_out_split_is_seeded_disjoint_and_keeps_rows():
    rows = [Example("classify", f"d{i}", label=i % 2) for i in range(50)]
    train, held = split_held_out(rows, 0.2, seed=3)
    assert len(held) == 10 and len(train) == 40
    assert {e.text for e in train}.isdisjoint({e.text for e in held})
    assert split_held_out(rows, 0.2, seed=3) == (train, held)
    assert split_held_out(rows, 0.2, seed=4)[1] != held
    with pytest.raises(SpecError, match=r"spec\.eval\.fraction"):
        split_held_out(rows[:1], 0.5, seed=0)


def test_eval_needs_exactly_one_of_path_or_fraction(tmp_path):
    cfg = tiny_manifest(tmp_path, eval={"path": "x.tsv", "fraction": 0.1})
    with pytest.raises(SpecError, match=r"set exactly one of eval\.path or eval\.fraction"):
        load_manifest(str(cfg))


# ------------------------------------------------------------- runs with the stand-in engine


def test_epochs_and_cosine_warmup_set_the_record_lr(tmp_path, standin):
    # nsmc-mini: 400 rows, 20 % held out → 320; batch 8 × accum 2 → 20 steps per epoch
    cfg = tiny_manifest(
        tmp_path,
        training={
            "steps": None,
            "epochs": 1,
            "batchSize": 8,
            "gradAccumulation": 2,
            "scheduler": "cosine",
            "warmupSteps": 4,
            "learningRate": 1e-3,
        },
        moe={"placement": "host-only"},
        eval={"fraction": 0.2, "maxExamples": 6},
    )
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot"]) == 0
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == list(range(1, 21))
    lrs = [r["lr"] for r in recs]
    assert lrs[:5] == pytest.approx([0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3])
    s = 9  # cosine: 0.5 * (1 + cos(pi * (s - 1 - warmup) / (total - warmup)))
    assert lrs[s - 1] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * (s - 5) / 16)))
    assert lrs[-1] < 2e-5
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schedule"] == {
        "scheduler": "cosine",
        "warmup_steps": 4,
        "epochs": 1.0,
        "examples": 320,
    }
    assert summary["total_steps"] == 20
    ev = summary["eval"]
    assert ev["examples"] == 6 and ev["labels"] == 2 and ev["evaluations"] == 1
    assert ev["best"]["step"] == 20 and ev["seconds"] > 0
    assert [r["step"] for r in read_metrics(out / "eval.jsonl")] == [20]
    assert "eval_s" in recs[-1] and "eval_s" not in recs[0]
    assert (out / "adapter-best" / "adapter_config.json").is_file()


def test_eval_rows_need_a_valid_file_naming_the_field(tmp_path, capsys, standin):
    cfg = tiny_manifest(tmp_path, eval={"path": str(tmp_path / "missing.tsv")})
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 2
    assert "spec.eval.path" in capsys.readouterr().err
    assert not out.exists()


# --------------------------------------------------- the real engine: kill, resume, compare


STEPS, EVERY_CKPT, EVERY_EVAL = 10, 3, 2


def test_sigkill_resume_restores_schedule_and_eval_and_eval_never_changes_training(tmp_path):
    """Reference: no eval, uninterrupted. Run: eval every 2 steps, SIGKILLed after its first
    checkpoint, rerun. Same losses, learning rates and adapter (eval changes nothing, the
    schedule resumes exactly); each evaluation once; adapter-best is the best eval step's."""
    train = {"steps": STEPS, "scheduler": "linear", "warmupSteps": 3, "learningRate": 5e-3}
    common = {
        "moe": {"placement": "hot", "warmupSteps": 4},
        "checkpoint": {"everySteps": EVERY_CKPT},
        "lora": {"dropout": 0.1},  # eval must not consume the dropout RNG
    }
    ref_cfg = tiny_manifest(tmp_path, name="ref", training=train, **common)
    ev = {"path": str(_eval_file(tmp_path)), "everySteps": EVERY_EVAL}
    cfg = tiny_manifest(tmp_path, name="ev", training=train, eval=ev, **common)
    env = {"NPU_LORA_DETERMINISTIC": "1", "OMP_NUM_THREADS": "2"}
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref_proc = subprocess.Popen(
        cli_cmd("run", str(ref_cfg), "--quiet", "--no-plot", "--out", str(ref)),
        env=cli_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    args = ("run", str(cfg), "--quiet", "--no-plot", "--out", str(out))
    proc = subprocess.Popen(
        cli_cmd(*args), env=cli_env(**env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 300
    try:
        while True:
            n = len(read_metrics(out / "metrics.jsonl"))
            if n >= EVERY_CKPT + 2 and (out / "checkpoint" / "state.json").is_file():
                break
            if proc.poll() is not None:
                pytest.fail(f"the run ended before it could be killed: {proc.stderr.read()}")
            if time.monotonic() > deadline:
                pytest.fail("timed out waiting for the first checkpoint")
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["scheduler"]["last_epoch"] == state["step"]
    r = run_cli(*args, **env)
    assert r.returncode == 0, r.stderr
    _, ref_err = ref_proc.communicate(timeout=600)
    assert ref_proc.returncode == 0, ref_err

    a, b = read_metrics(out / "metrics.jsonl"), read_metrics(ref / "metrics.jsonl")
    assert [x["step"] for x in a] == list(range(1, STEPS + 1))
    assert [x["loss"] for x in a] == [x["loss"] for x in b], "eval or resume changed the losses"
    assert [x["lr"] for x in a] == [x["lr"] for x in b], "the schedule did not resume exactly"
    assert [x["lr"] for x in b][:4] == pytest.approx([0.0, 5e-3 / 3, 1e-2 / 3, 5e-3])
    wa = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    wb = load_file(str(ref / "adapter" / "adapter_model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    evals = read_metrics(out / "eval.jsonl")
    assert [e["step"] for e in evals] == list(range(EVERY_EVAL, STEPS + 1, EVERY_EVAL))
    assert all(e["accuracy"] is not None and e["examples"] == 24 for e in evals)
    best = min(evals, key=lambda e: e["loss"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval"]["best"] == {"step": best["step"], "loss": best["loss"]}
    assert summary["eval"]["evaluations"] == len(evals)
    assert (out / "adapter-best" / "adapter_model.safetensors").is_file()
    if best["step"] == STEPS:
        wbest = load_file(str(out / "adapter-best" / "adapter_model.safetensors"))
        assert all(torch.equal(wa[k], wbest[k]) for k in wa)
