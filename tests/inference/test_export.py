"""``npu-lora export --merged``: a Hugging Face directory equal to base + adapter."""

from __future__ import annotations

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


def test_export_refuses_a_non_empty_dir_unless_forced(finished_run, tmp_path, capsys):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert main(["export", str(finished_run), "--merged", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "keep.txt").exists()
    assert main(["export", str(finished_run), "--merged", str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
