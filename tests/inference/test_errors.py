"""Unusable inputs exit 2 naming what is wrong, and write nothing."""

from __future__ import annotations

import json
import shutil

from adapter_helpers import nsmc_rows
from npu_lora.cli import main


def test_a_run_dir_without_adapter_exits_2_naming_it(finished_run, tmp_path, capsys):
    broken = tmp_path / "run"
    broken.mkdir()
    shutil.copy(finished_run / "config.yaml", broken / "config.yaml")
    data = nsmc_rows(tmp_path / "t.tsv", 2)
    assert main(["predict", str(broken), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "has no adapter/" in err
    assert not (broken / "predictions").exists()
    assert main(["export", str(broken), "--merged", str(tmp_path / "m")]) == 2
    assert "has no adapter/" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_a_dir_without_config_exits_2(tmp_path, capsys):
    assert main(["chat", str(tmp_path)]) == 2
    assert "has no config.yaml" in capsys.readouterr().err


def test_a_bad_data_row_exits_2_naming_file_line_and_field(finished_run, tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "ok"}\n{"prompt": "p"}\n', encoding="utf-8")
    out = tmp_path / "pred.jsonl"
    assert main(["predict", str(finished_run), "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:2" in err and "completion" in err and "--data" in err
    assert not out.exists()


def test_a_base_that_differs_from_the_recorded_one_exits_2(finished_run, tmp_path, capsys):
    other = tmp_path / "run"
    shutil.copytree(finished_run, other, ignore=shutil.ignore_patterns("checkpoint*"))
    fp = other / "adapter" / "npu_lora_base.json"
    d = json.loads(fp.read_text())
    d["digest"] = "0" * 64
    fp.write_text(json.dumps(d))
    data = nsmc_rows(tmp_path / "t.tsv", 2)
    assert main(["predict", str(other), "--data", str(data), "-q"]) == 2
    assert "differs from the one the adapter" in capsys.readouterr().err


def test_the_run_records_its_base_fingerprint(finished_run):
    in_adapter = json.loads((finished_run / "adapter" / "npu_lora_base.json").read_text())
    summary = json.loads((finished_run / "summary.json").read_text())
    assert in_adapter == summary["base_fingerprint"]
    assert len(in_adapter["digest"]) == 64 and in_adapter["tensors"] > 0


def test_a_missing_adapter_best_exits_2_with_a_hint(finished_run, capsys):
    assert main(["chat", str(finished_run), "--adapter", "adapter-best"]) == 2
    assert "has no adapter-best/" in capsys.readouterr().err


def test_a_pickle_adapter_exits_2_naming_it_and_is_never_unpickled(finished_run, tmp_path, capsys):
    import torch

    other = tmp_path / "run"
    shutil.copytree(finished_run, other, ignore=shutil.ignore_patterns("checkpoint*"))
    (other / "adapter" / "adapter_model.safetensors").unlink()
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (shutil.copyfile, (str(other / "config.yaml"), str(marker)))

    torch.save(Payload(), other / "adapter" / "adapter_model.bin")
    assert main(["chat", str(other)]) == 2
    err = capsys.readouterr().err
    assert "adapter_model.bin: a pickle adapter" in err and "Traceback" not in err
    assert main(["export", str(other), "--merged", str(tmp_path / "m")]) == 2
    assert "adapter_model.bin" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "m").exists()


def test_a_pickle_checkpoint_exits_2_naming_it(finished_run, tmp_path, capsys):
    other = tmp_path / "run"
    shutil.copytree(finished_run, other)
    ckpt = other / "checkpoint"
    state = json.loads((ckpt / "state.json").read_text())
    (ckpt / "state.json").write_text(json.dumps({**state, "format": 1}))
    (ckpt / "params.pt").write_bytes(b"\x80\x04N.")
    data = nsmc_rows(tmp_path / "t.tsv", 2)
    assert main(["predict", str(other), "--adapter", "checkpoint", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint/params.pt: a checkpoint of format 1" in err and "Traceback" not in err


def test_predict_out_that_is_a_directory_exits_2_naming_it(finished_run, tmp_path, capsys):
    data = nsmc_rows(tmp_path / "t.tsv", 2)
    out = tmp_path / "preds"
    out.mkdir()
    assert main(["predict", str(finished_run), "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out: {out} is a directory" in err and "Traceback" not in err
    assert list(out.iterdir()) == []
