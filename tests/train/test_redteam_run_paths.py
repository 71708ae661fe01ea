"""Run paths a hostile pass found open (issue 38): a NUL in ``spec.resumeFrom``, a symbolic link
as the resumeFrom source's ``checkpoint/``, a symbolic link as the run's own ``checkpoint/``.
Each is refused naming the path (SpecError: exit 2), nothing read through the link."""

from __future__ import annotations

import json

import pytest
from npu_lora.api.load import SpecError
from npu_lora.train.checkpoint import find_checkpoint
from npu_lora.train.identity import _check_checkpoint_files, resolve_resume_from


def _checkpoint(d):
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"format": 2, "step": 3}))
    (d / "params.json").write_text("{}")
    return d


@pytest.mark.parametrize("value", ["run\x00x", "\x00", "a/\x00/b"])
def test_a_nul_in_resume_from_is_named_not_a_traceback(tmp_path, value):
    with pytest.raises(SpecError, match=r"spec\.resumeFrom: .*NUL"):
        resolve_resume_from(value, tmp_path / "mine")


def test_a_resume_from_checkpoint_that_is_a_link_is_not_read(tmp_path):
    victim = _checkpoint(tmp_path / "other-namespace" / "run" / "checkpoint")
    source = tmp_path / "root" / "src"
    source.mkdir(parents=True)
    (source / "checkpoint").symlink_to(victim)
    with pytest.raises(SpecError, match=r"checkpoint is not a directory of its own"):
        _check_checkpoint_files(source / "checkpoint")


def test_a_resume_from_source_with_a_linked_checkpoint_fails_the_run(tmp_path, monkeypatch, capsys):
    """End to end through ``npu-lora run``: exit 2 naming the link; nothing copied."""
    from npu_lora.cli import main
    from testkit import isolate_worker_env

    isolate_worker_env(monkeypatch, tmp_path)
    victim = _checkpoint(tmp_path / "elsewhere" / "checkpoint")
    src = tmp_path / "src"
    src.mkdir()
    (src / "run.json").write_text(json.dumps({"name": "a", "namespace": None, "runId": "r1"}))
    (src / "checkpoint").symlink_to(victim)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "apiVersion: npu-lora.io/v1alpha1\nkind: MoEFinetune\nmetadata:\n  name: b\nspec:\n"
        "  model:\n    preset: tiny-qwen3-moe\n  data:\n    path: example:nsmc-mini\n"
        "  moe:\n    placement: host-only\n    warmupSteps: 1\n  training:\n    steps: 3\n    seqLen: 32\n    batchSize: 2\n"
        "  device:\n    backend: cpu\n    cards: 0\n  resumeFrom: src\n"
    )
    (src / "config.yaml").write_text(manifest.read_text().replace("  resumeFrom: src\n", ""))
    out = tmp_path / "mine"
    assert main(["run", str(manifest), "--out", str(out), "-q", "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "src/checkpoint" in err and "symbolic link" in err
    assert not (out / "checkpoint").exists()


@pytest.mark.parametrize("name", ["checkpoint", "checkpoint.old-123"])
def test_a_run_directorys_own_checkpoint_link_is_refused(tmp_path, name):
    victim = _checkpoint(tmp_path / "elsewhere" / "checkpoint")
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(victim)
    with pytest.raises(SpecError, match=r"symbolic link"):
        find_checkpoint(run)
    assert (victim / "state.json").is_file()
