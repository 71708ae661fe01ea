"""Run directories reached through symlinks planted in the volume (issue 28, hostile pass 3):
the ownership checks look at the directory a link leads to, so a link never makes a run write
into, above or over another run's directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from npu_lora.api.load import SpecError, load_manifest
from npu_lora.train.identity import RUN_FILE, check_own_directory, plan_run
from train_helpers import as_run, snapshot, tiny_manifest


def _other_run(vol: Path) -> Path:
    other = vol / "other"
    (other / "checkpoint").mkdir(parents=True)
    ident = {"name": "other", "namespace": "team", "uid": "uid-other", "runId": "uid-other"}
    (other / RUN_FILE).write_text(json.dumps(ident), encoding="utf-8")
    return other


def test_a_link_to_another_runs_directory_is_that_run_s(tmp_path: Path, monkeypatch) -> None:
    vol = tmp_path / "vol"
    other = _other_run(vol)
    before = snapshot(other)
    (vol / "mine").symlink_to(other)
    as_run(monkeypatch, "team", "uid-mine")
    manifest = load_manifest(tiny_manifest(tmp_path, name="mine"))
    with pytest.raises(SpecError, match=r"belongs to run team/other \(uid uid-other\)"):
        plan_run(vol / "mine", manifest)
    assert snapshot(other) == before


def test_a_link_into_another_runs_directory_is_inside_it(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    other = _other_run(vol)
    (vol / "mine").symlink_to(other / "checkpoint")
    with pytest.raises(SpecError, match="is inside the run directory"):
        check_own_directory(vol / "mine")


def test_a_link_to_the_filesystem_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mine").symlink_to("/")
    with pytest.raises(SpecError, match="filesystem or volume root"):
        check_own_directory(tmp_path / "mine")
