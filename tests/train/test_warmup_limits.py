"""A learning-rate warm-up that would never end within the run is refused (exit 2, naming
``spec.training.warmupSteps``) before anything is written."""

from __future__ import annotations

from testkit import isolate_worker_env, tiny_manifest
from train_helpers import run_in_process


def test_warmup_steps_not_less_than_the_steps_exit_2(tmp_path, monkeypatch, capsys):
    isolate_worker_env(monkeypatch, tmp_path)
    cfg = tiny_manifest(
        tmp_path,
        moe={"placement": "host-only"},
        training={"steps": 3, "warmupSteps": 3, "scheduler": "linear"},
    )
    out = tmp_path / "out"
    assert run_in_process(cfg, out) == 2
    err = capsys.readouterr().err
    assert "spec.training.warmupSteps: 3 is not less than the run's 3 steps" in err
    assert not out.exists()


def test_warmup_steps_beyond_an_epochs_run_are_refused_once_the_steps_are_known(
    tmp_path, monkeypatch, capsys
):
    isolate_worker_env(monkeypatch, tmp_path)
    cfg = tiny_manifest(
        tmp_path,
        moe={"placement": "host-only"},
        training={"steps": None, "epochs": 1, "batchSize": 64, "warmupSteps": 500},
    )
    out = tmp_path / "out"
    assert run_in_process(cfg, out) == 2
    assert "spec.training.warmupSteps: 500 is not less than the run's" in capsys.readouterr().err
    assert not out.exists()
