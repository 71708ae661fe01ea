"""``npu-lora export --merged``: a Hugging Face directory equal to base + adapter."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from npu_lora.cli import main


def test_merged_model_loads_with_automodel_and_matches_base_plus_adapter(finished_run, tmp_path):
    from npu_lora.inference.export import plain_model
    from npu_lora.inference.load import load_run
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    assert main(["export", str(finished_run), "--merged", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    assert not any(n.startswith(".") for n in tmp_path.iterdir() for n in [n.name])

    merged, info = AutoModelForCausalLM.from_pretrained(
        str(out), local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    ids = torch.tensor([tok.encode("리뷰: 재밌다\n감정:", add_special_tokens=False)])

    reference = plain_model(load_run(finished_run), torch.float32)  # base + adapter, unmerged
    with torch.no_grad():
        want = reference(input_ids=ids).logits
        with reference.disable_adapter():
            base = reference(input_ids=ids).logits
        got = merged.eval()(input_ids=ids).logits
    assert (got - want).abs().max() <= 1e-4
    assert (base - want).abs().max() > 1e-3  # the adapter changed something


def test_force_replaces_only_a_previous_export(finished_run, tmp_path, capsys):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert main(["export", str(finished_run), "--merged", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["export", str(finished_run), "--merged", str(out), "--force"]) == 2
    assert "was not written by `npu-lora export`" in capsys.readouterr().err
    assert (out / "keep.txt").exists()
    (out / "keep.txt").unlink()
    assert main(["export", str(finished_run), "--merged", str(out)]) == 0
    assert (out / "npu_lora_export.json").is_file()
    assert main(["export", str(finished_run), "--merged", str(out), "--force"]) == 0
    assert (out / "model.safetensors").is_file()
    (out / "notes.md").write_text("mine")  # a file the export did not write
    assert main(["export", str(finished_run), "--merged", str(out), "--force"]) == 2
    assert "holds files a previous export did not write (notes.md)" in capsys.readouterr().err
    assert (out / "notes.md").read_text() == "mine"


@pytest.mark.parametrize("target", ["run", "parent", "root", "home", "other-run"])
def test_force_never_replaces_a_run_its_ancestors_root_or_home(
    finished_run, tmp_path, monkeypatch, capsys, target
):
    runs = tmp_path / "runs"
    run = runs / "a"
    shutil.copytree(finished_run, run)
    home = tmp_path / "home"
    (home / "x").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    other = tmp_path / "other"  # another run's directory (not the one exported)
    shutil.copytree(finished_run, other, ignore=shutil.ignore_patterns("checkpoint*"))
    out, needle = {
        "run": (run, "is the run directory being exported"),
        "parent": (runs, "is an ancestor of the run directory"),
        "root": (Path("/"), "is the filesystem root"),
        "home": (home, "is the home directory ($HOME)"),
        "other-run": (other, "is a run directory"),
    }[target]
    before = sorted(p.name for p in out.iterdir())
    assert main(["export", str(run), "--merged", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == before
    assert (run / "checkpoint" / "state.json").is_file()
