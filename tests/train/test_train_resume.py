"""SIGKILL in the middle of a run, rerun the same command: no step lost or duplicated, and the
final adapter is bitwise equal to an uninterrupted run's (``NPU_LORA_DETERMINISTIC=1``:
``torch.use_deterministic_algorithms(True)``, same thread count)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from npu_lora.train.checkpoint import FORMAT, clean_stale, find_checkpoint
from npu_lora.train.rundir import read_metrics, truncate_metrics
from safetensors.torch import load_file
from train_helpers import cli_cmd, cli_env, run_cli, tiny_manifest

STEPS = 10
EVERY = 3
WARMUP = 4  # the first checkpoint (step 3) predates the hot-set choice (after step 4)
K = 2  # kill once this many records past the first checkpoint are written


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sigkill_resume_is_exact(tmp_path):
    cfg = tiny_manifest(
        tmp_path,
        training={"steps": STEPS},
        moe={"placement": "hot", "warmupSteps": WARMUP},
        checkpoint={"everySteps": EVERY},
    )
    env = {"NPU_LORA_DETERMINISTIC": "1", "OMP_NUM_THREADS": "2"}
    ref, out = tmp_path / "ref", tmp_path / "out"
    args = ("run", str(cfg), "--quiet", "--no-plot")

    # the uninterrupted reference run, concurrently (deterministic algorithms: timing-independent)
    ref_proc = subprocess.Popen(
        cli_cmd(*args, "--out", str(ref)),
        env=cli_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc = subprocess.Popen(
        cli_cmd(*args, "--out", str(out)),
        env=cli_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    try:
        while True:
            n = len(read_metrics(out / "metrics.jsonl"))
            if n >= EVERY + K and (out / "checkpoint" / "state.json").is_file():
                break
            if proc.poll() is not None:
                pytest.fail(f"the run ended before it could be killed: {proc.stderr.read()}")
            if time.monotonic() > deadline:
                pytest.fail("timed out waiting for the first checkpoint")
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = _steps(out)
    ckpt = json.loads((out / "checkpoint" / "state.json").read_text())["step"]
    assert killed_at[-1] > ckpt and killed_at[-1] < STEPS, (killed_at, ckpt)
    assert not (out / "adapter").exists() and not (out / "summary.json").exists()

    r = run_cli(*args, "--out", str(out), **env)
    assert r.returncode == 0, r.stderr
    assert f"from the checkpoint at step {ckpt}" in r.stderr
    assert _steps(out) == list(range(1, STEPS + 1)), "every step exactly once"
    assert json.loads((out / "summary.json").read_text())["resumed_from"] == ckpt

    _, ref_err = ref_proc.communicate(timeout=300)
    assert ref_proc.returncode == 0, ref_err

    a = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(ref / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
    la = [x["loss"] for x in read_metrics(out / "metrics.jsonl")]
    lb = [x["loss"] for x in read_metrics(ref / "metrics.jsonl")]
    assert la == lb, "per-step losses differ after resume"
    hot_a = json.loads((out / "summary.json").read_text())["hot"]
    assert hot_a == json.loads((ref / "summary.json").read_text())["hot"]
    assert hot_a["selected_at_step"] == WARMUP


# ------------------------------------------------------------------------ units of the resume


def _fake_ckpt(path: Path, step: int) -> None:
    path.mkdir()
    (path / "state.json").write_text(json.dumps({"format": FORMAT, "step": step}))


def test_find_checkpoint_survives_a_crash_between_the_renames(tmp_path):
    assert find_checkpoint(tmp_path) is None
    _fake_ckpt(tmp_path / "checkpoint.old-123", 4)  # previous complete one, renamed away
    (tmp_path / "checkpoint.tmp-123").mkdir()  # the new one, incomplete
    path, state = find_checkpoint(tmp_path)
    assert path.name == "checkpoint.old-123" and state["step"] == 4
    clean_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert find_checkpoint(tmp_path)[1]["step"] == 4
    # a complete checkpoint/ wins over an old one; the old one is removed
    _fake_ckpt(tmp_path / "checkpoint.old-9", 2)
    assert find_checkpoint(tmp_path)[0].name == "checkpoint"
    clean_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_truncate_metrics_drops_later_duplicate_and_torn_records(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text(
        '{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.9}\n{"step": 2, "loss": 9}\n'
        '{"step": 3, "loss": 0.8}\n{"step": 4, "lo',
        encoding="utf-8",
    )
    kept = truncate_metrics(m, 2)
    assert [r["step"] for r in kept] == [1, 2] and kept[1]["loss"] == 0.9
    assert m.read_text().count("\n") == 2
    assert truncate_metrics(tmp_path / "none.jsonl", 0) == []
    assert not (tmp_path / "none.jsonl").exists()


def test_termination_message_is_bounded(tmp_path, monkeypatch):
    from npu_lora.train.termination import write_termination_message

    monkeypatch.setenv("NPU_LORA_TERMINATION_LOG", str(tmp_path / "t"))
    write_termination_message({"status": "succeeded", "final_loss": 1.5, "junk": "x" * 10000})
    got = json.loads((tmp_path / "t").read_text())
    assert got == {"status": "succeeded", "final_loss": 1.5}
    write_termination_message("é" * 5000)
    assert len((tmp_path / "t").read_bytes()) <= 4096
    monkeypatch.delenv("NPU_LORA_TERMINATION_LOG")
    if not Path("/dev/termination-log").exists():
        assert write_termination_message("x") is None


def test_sigterm_checkpoints_the_current_step(tmp_path):
    cfg = tiny_manifest(
        tmp_path,
        training={"steps": 200},
        moe={"placement": "host-only"},
        checkpoint={"everySteps": 1000},
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        cli_cmd("run", str(cfg), "--quiet", "--no-plot", "--out", str(out)),
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    try:
        while len(read_metrics(out / "metrics.jsonl")) < 2:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by signal 15" in err
    last = _steps(out)[-1]
    assert 2 <= last < 200
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == last
