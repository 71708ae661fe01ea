"""``spec.resumeFrom`` stays inside the run's own storage: relative, no ``..``, no symbolic link
on the way (walked with openat), a ``run.json`` of the same namespace, a checkpoint of regular
files."""

from __future__ import annotations

import json

import pytest
from npu_lora.api.load import SpecError
from npu_lora.train.identity import (
    RunIdentity,
    _check_checkpoint_files,
    _check_source,
    output_root,
    resolve_resume_from,
)

ME = RunIdentity("r", "team-a", "uid-1", "uid-1")


def _run(d, namespace="team-a"):
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"name": "x", "namespace": namespace, "uid": "u"}))
    return d


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("/etc", "is absolute"),
        ("~/runs/a", "is absolute"),
        ("../other-ns/run", "contains '..'"),
        ("a/../../b", "contains '..'"),
        (".", "names the output root"),
        ("./", "names the output root"),
    ],
)
def test_paths_that_leave_the_output_root_are_refused(tmp_path, value, needle):
    with pytest.raises(SpecError, match=rf"spec\.resumeFrom: .*{needle}"):
        resolve_resume_from(value, tmp_path / "mine")


def test_a_relative_path_resolves_below_the_run_directorys_parent(tmp_path):
    _run(tmp_path / "team" / "old")
    assert resolve_resume_from("team/old", tmp_path / "mine") == tmp_path / "team" / "old"
    assert resolve_resume_from("./team//old/", tmp_path / "mine") == tmp_path / "team" / "old"


def test_in_a_cluster_the_root_is_the_output_volume(tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_LORA_OUTPUT_ROOT", str(tmp_path))
    run_dir = tmp_path / "group" / "mine"
    assert output_root(run_dir) == tmp_path.resolve()
    assert resolve_resume_from("other", run_dir) == tmp_path.resolve() / "other"


@pytest.mark.parametrize("where", ["out", "inside"])
def test_a_symbolic_link_on_the_way_is_never_followed(tmp_path, where):
    outside = _run(tmp_path / "elsewhere" / "victim")
    root = tmp_path / "root"
    root.mkdir()
    target = outside if where == "out" else _run(root / "real")
    (root / "link").symlink_to(target)
    with pytest.raises(SpecError, match=r"'link' .* is a symbolic link"):
        resolve_resume_from("link", root / "mine")
    (root / "dir").mkdir()
    (root / "dir" / "link").symlink_to(outside.parent)
    with pytest.raises(SpecError, match=r"'dir/link' .* is a symbolic link"):
        resolve_resume_from("dir/link/victim", root / "mine")


def test_a_file_on_the_way_is_named(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SpecError, match=r"'f' .* is not a directory"):
        resolve_resume_from("f/run", tmp_path / "mine")


def test_the_source_must_be_a_run_of_the_same_namespace(tmp_path):
    with pytest.raises(SpecError, match=r"has no readable run\.json"):
        _check_source(tmp_path, ME)
    other = _run(tmp_path / "b", namespace="team-b")
    with pytest.raises(SpecError, match=r"of another namespace than this run \(team-a\)"):
        _check_source(other, ME)
    _check_source(_run(tmp_path / "a"), ME)


def test_a_checkpoint_holding_a_link_is_not_read(tmp_path):
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    (ckpt / "state.json").write_text("{}")
    _check_checkpoint_files(ckpt)
    (ckpt / "params.safetensors").symlink_to(tmp_path / "secret")
    with pytest.raises(SpecError, match=r"params\.safetensors is not a regular file"):
        _check_checkpoint_files(ckpt)
