"""Every command that writes refuses an output path of the wrong kind (exit 2, naming it)
before any work: a directory where a file is expected, a file where a directory is."""

from __future__ import annotations

import pytest
from npu_lora.api.load import SpecError
from npu_lora.api.outpaths import EXPORT_MARKER, check_out_dir, check_out_file, check_replaceable
from npu_lora.cli import main


def test_a_file_output_that_is_a_directory_is_refused(tmp_path):
    with pytest.raises(SpecError, match=r"--out: .* is a directory; a file path is expected"):
        check_out_file(tmp_path, "--out")
    (tmp_path / "f").write_text("x")
    with pytest.raises(SpecError, match=r"--out: .*/f is a file, so .* cannot be created"):
        check_out_file(tmp_path / "f" / "g.jsonl", "--out")
    check_out_file(tmp_path / "new" / "g.jsonl", "--out")


def test_a_directory_output_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SpecError, match=r"--out: .*/f exists and is not a directory"):
        check_out_dir(tmp_path / "f", "--out")
    check_out_dir(tmp_path / "d", "--out")


def test_a_marker_that_lists_a_directory_does_not_make_it_replaceable(tmp_path):
    out = tmp_path / "m"
    (out / "sub").mkdir(parents=True)
    (out / EXPORT_MARKER).write_text('{"kind": "npu-lora-export", "files": ["sub"]}')
    with pytest.raises(SpecError, match=r"did not write \(sub\)"):
        check_replaceable(out, "--merged", True)


def test_bench_out_that_is_a_file_exits_2(tmp_path, capsys):
    f = tmp_path / "bench-out"
    f.write_text("keep")
    assert main(["bench", "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"--out: {f} exists and is not a directory" in err
    assert f.read_text() == "keep"
    assert main(["bench", "--roofline", str(f)]) == 2
    assert "--roofline" in capsys.readouterr().err


def test_rngd_check_json_that_is_a_directory_exits_2(tmp_path, capsys):
    assert main(["rngd-check", "--json", str(tmp_path)]) == 2
    assert f"--json: {tmp_path} is a directory" in capsys.readouterr().err


def test_a_file_output_never_overwrites_a_run_directorys_own_files(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "config.yaml").write_text("x")
    for target in (run / "config.yaml", run / "metrics.jsonl", run / "run.json"):
        with pytest.raises(SpecError, match=r"is a file of the run directory"):
            check_out_file(target, "--out")
    with pytest.raises(SpecError, match=r"inside checkpoint/ of the run directory"):
        check_out_file(run / "checkpoint" / "state.json", "--out")
    check_out_file(run / "predictions" / "p.jsonl", "--out")
    check_out_file(tmp_path / "config.yaml", "--out")  # not a run directory


def test_a_marker_without_a_file_list_does_not_make_a_directory_replaceable(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "a").write_text("mine")
    (out / EXPORT_MARKER).write_text('{"kind": "npu-lora-export", "files": "a"}')
    with pytest.raises(SpecError, match=r"listing its files"):
        check_replaceable(out, "--merged", True)
