"""Run directories are owned (issue 28): a run directory is a directory of its own: not the
volume root, not inside or above another run's directory; moving a stale directory aside
touches only that run's own directory. The same rules in `npu-lora run` and in the cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from npu_lora.api.load import SpecError
from npu_lora.api.v1alpha1 import EXIT_CONFIG_ERROR, OutputSpec
from npu_lora.cli import main
from npu_lora.train.identity import RUN_FILE, check_own_directory
from train_helpers import as_run, run_in_process, snapshot, tiny_manifest


def _cfg(tmp_path: Path, name: str = "same") -> Path:
    return tiny_manifest(tmp_path, name=name, training={"steps": 2}, moe={"placement": "host-only"})


@pytest.mark.parametrize("path", [".", "./", "/", "a/..", "../other", "a/../../b", "./."])
def test_output_path_must_name_a_directory_of_its_own(path: str) -> None:
    with pytest.raises(ValueError, match=r"output\.path"):
        OutputSpec(path=path)


def test_output_path_dot_is_refused_by_npu_lora_run(tmp_path, capsys):
    code = main(["run", str(_cfg(tmp_path)), "--set", "output.path=.", "--quiet", "--no-plot"])
    err = capsys.readouterr().err
    assert code == EXIT_CONFIG_ERROR and "spec.output.path" in err and "Traceback" not in err


def test_a_filesystem_root_is_not_a_run_directory() -> None:
    with pytest.raises(SpecError, match="filesystem or volume root"):
        check_own_directory(Path("/"))


def test_inside_another_runs_directory_is_refused(tmp_path, capsys, monkeypatch, standin):
    cfg = _cfg(tmp_path)
    first = tmp_path / "vol" / "first"
    as_run(monkeypatch, "team", "uid-first")
    assert run_in_process(cfg, first) == 0
    before = snapshot(first)
    capsys.readouterr()
    as_run(monkeypatch, "team", "uid-second")
    for inner in (first / "checkpoint", first / "adapter" / "x", first / "new"):
        code = run_in_process(_cfg(tmp_path, "other"), inner)
        err = capsys.readouterr().err
        assert code == EXIT_CONFIG_ERROR, err
        assert f"is inside the run directory {first.resolve()}" in err
        assert "team/same (uid uid-first)" in err and "Traceback" not in err
    assert snapshot(first) == before


def test_above_another_runs_directory_is_refused(tmp_path, capsys, monkeypatch, standin):
    vol = tmp_path / "vol"
    as_run(monkeypatch, "team", "uid-a")
    assert run_in_process(_cfg(tmp_path, "a"), vol / "deep" / "a") == 0
    before = snapshot(vol)
    capsys.readouterr()
    as_run(monkeypatch, "team", "uid-b")
    for outer in (vol, vol / "deep"):
        code = run_in_process(_cfg(tmp_path, "b"), outer)
        err = capsys.readouterr().err
        assert code == EXIT_CONFIG_ERROR, err
        assert "contains the run directory" in err and "team/a (uid uid-a)" in err
    assert snapshot(vol) == before


def test_moving_a_stale_directory_aside_touches_nothing_else(
    tmp_path, capsys, monkeypatch, standin
):
    vol = tmp_path / "vol"
    as_run(monkeypatch, "team", "uid-x1")
    assert run_in_process(_cfg(tmp_path, "x"), vol / "x") == 0
    as_run(monkeypatch, "team", "uid-y")
    assert run_in_process(_cfg(tmp_path, "y"), vol / "y") == 0
    (vol / "unrelated.txt").write_text("keep")
    others = snapshot(vol / "y")
    # x deleted and re-created: only x's directory moves aside
    as_run(monkeypatch, "team", "uid-x2")
    assert run_in_process(_cfg(tmp_path, "x"), vol / "x") == 0
    assert "starting fresh" in capsys.readouterr().err
    assert sorted(p.name for p in vol.iterdir()) == ["unrelated.txt", "x", "x.prev-uid-x1", "y"]
    assert snapshot(vol / "y") == others
    assert json.loads((vol / "x" / RUN_FILE).read_text())["uid"] == "uid-x2"


def test_own_resume_is_not_mistaken_for_nesting(tmp_path, monkeypatch, standin):
    as_run(monkeypatch, "team", "uid-1")
    out = tmp_path / "r"
    cfg = _cfg(tmp_path)
    assert run_in_process(cfg, out) == 0
    assert run_in_process(cfg, out, "--steps", "3") == 0
