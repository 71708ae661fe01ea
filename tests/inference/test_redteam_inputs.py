"""Hostile files in a finished run directory and hostile CLI values (red-team pass, issue 38):
each exits 2 naming the file or flag, never a traceback with exit 1, and destroys nothing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from adapter_helpers import nsmc_rows
from npu_lora.cli import main
from safetensors.torch import save_file


def _copy(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns("checkpoint*"))
    return run


@pytest.mark.parametrize("digest", [12345, ["x"], {"a": 1}, None])
def test_a_fingerprint_edited_by_hand_is_no_traceback(finished_run, tmp_path, capsys, digest):
    run = _copy(finished_run, tmp_path)
    fp = run / "adapter" / "npu_lora_base.json"
    d = json.loads(fp.read_text())
    d["digest"] = digest
    fp.write_text(json.dumps(d))
    summary = run / "summary.json"
    s = json.loads(summary.read_text())
    s["base_fingerprint"] = d
    summary.write_text(json.dumps(s))
    data = nsmc_rows(tmp_path / "t.tsv", 2)
    # no usable record: "not verified" (as for a run made before fingerprints), never exit 1
    assert main(["predict", str(run), "--data", str(data), "-q"]) == 0
    assert "NOT verified" in capsys.readouterr().err


@pytest.mark.parametrize(
    "tensors",
    [
        {"bogus": torch.zeros(2)},
        {"a.b.x.c": torch.zeros(2)},
        {"mlp.layers.999.gate_up_proj": torch.zeros(2)},
        {"mlp.layers.0.no_such_weight": torch.zeros(2)},
        {"mlp.layers.0.gate_up_proj": torch.zeros(3, 3)},
    ],
)
def test_a_planted_experts_file_exits_2_naming_it(finished_run, tmp_path, capsys, tensors):
    run = _copy(finished_run, tmp_path)
    save_file(tensors, str(run / "adapter" / "experts.safetensors"))
    data = nsmc_rows(tmp_path / "t.tsv", 2)
    assert main(["predict", str(run), "--data", str(data), "-q"]) == 2
    err = capsys.readouterr().err
    assert "experts.safetensors" in err and "Traceback" not in err


@pytest.mark.parametrize("files", [[[1]], 5, "ab", {"a": 1}, [None]])
def test_export_force_refuses_a_marker_that_lists_no_files(finished_run, tmp_path, capsys, files):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "npu_lora_export.json").write_text(
        json.dumps({"kind": "npu-lora-export", "files": files})
    )
    (out / "a").write_text("mine")
    (out / "b").write_text("mine too")
    assert main(["export", str(finished_run), "--merged", str(out), "--force"]) == 2
    assert "npu_lora_export.json" in capsys.readouterr().err
    assert (out / "a").read_text() == "mine" and (out / "b").read_text() == "mine too"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_chat_refuses_a_temperature_that_is_no_number(finished_run, value, capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    assert main(["chat", str(finished_run), f"--temperature={value}"]) == 2
    assert "--temperature" in capsys.readouterr().err
