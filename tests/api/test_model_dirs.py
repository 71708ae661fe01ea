"""A model or tokenizer directory that asks for custom code (``auto_map``) or holds only pickle
weights is refused naming the file (exit 2 from ``npu-lora run``), before anything is loaded."""

from __future__ import annotations

import json

import pytest
from npu_lora.api.load import SpecError
from npu_lora.api.modeldir import check_model_dir, check_no_custom_code
from npu_lora.cli import main
from testkit import isolate_worker_env, tiny_manifest


def _model_dir(tmp_path, **config):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", **config}))
    return d


def test_a_config_with_auto_map_is_refused_naming_it(tmp_path):
    d = _model_dir(tmp_path, auto_map={"AutoModelForCausalLM": "evil.Model"})
    (d / "model.safetensors").write_bytes(b"")
    with pytest.raises(SpecError, match=r"spec\.model\.path: .*config\.json names custom code"):
        check_model_dir(d, "spec.model.path")


def test_a_tokenizer_config_with_auto_map_is_refused(tmp_path):
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": "x.T"}}))
    with pytest.raises(SpecError, match=r"tokenizer_config\.json names custom code"):
        check_no_custom_code(d, "spec.model.tokenizer")


def test_pickle_only_weights_are_refused_naming_the_file(tmp_path):
    d = _model_dir(tmp_path)
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(SpecError, match=r"pytorch_model\.bin is a pickle weight file"):
        check_model_dir(d, "spec.model.path")
    (d / "model.safetensors").write_bytes(b"")  # safetensors beside it: those are read
    check_model_dir(d, "spec.model.path")


def test_a_config_that_is_not_json_is_named(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(SpecError, match=r"config\.json: not UTF-8 JSON"):
        check_model_dir(d, "spec.model.path")


@pytest.mark.parametrize("case", ["auto_map", "pickle"])
def test_run_exits_2_naming_a_model_dir_it_will_not_load(tmp_path, monkeypatch, capsys, case):
    isolate_worker_env(monkeypatch, tmp_path)
    if case == "auto_map":
        d = _model_dir(tmp_path, auto_map={"AutoConfig": "evil.Config"})
        needle = "config.json names custom code"
    else:
        d = _model_dir(tmp_path)
        (d / "pytorch_model.bin").write_bytes(b"\x80\x04")
        needle = "pytorch_model.bin is a pickle weight file"
    cfg = tiny_manifest(tmp_path, model={"path": str(d), "preset": None})
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "-q", "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("how", ["dotdot", "symlink"])
def test_a_model_path_relative_to_its_volume_stays_on_it(tmp_path, monkeypatch, how):
    from npu_lora.api.load import load_manifest
    from npu_lora.train.preflight import check_model

    vol = tmp_path / "vol"
    vol.mkdir()
    outside = _model_dir(tmp_path)  # tmp_path/model, outside the volume
    (outside / "model.safetensors").write_bytes(b"")
    monkeypatch.setenv("NPU_LORA_MODEL_ROOT", str(vol))
    if how == "symlink":
        (vol / "m").symlink_to(outside)
        path = "m"
    else:
        path = "../model"
    m = load_manifest(
        {"model": {"path": path, "volume": {"claimName": "models"}}, "data": {"path": "x"}}
    )
    with pytest.raises(SpecError, match=r"spec\.model\.path: .* is outside its volume"):
        check_model(m.spec)
    (vol / "ok").mkdir()
    (vol / "ok" / "config.json").write_text("{}")
    check_model(m.spec.model_copy(update={"model": m.spec.model.model_copy(update={"path": "ok"})}))


@pytest.mark.parametrize(
    "shard", ["../other/model.safetensors", "/etc/passwd", "a/../../x.safetensors", 5, ""]
)
def test_an_index_naming_a_shard_outside_the_directory_is_refused(tmp_path, shard):
    """Red-team pass (issue 38): transformers joins ``weight_map`` values to the directory."""
    d = _model_dir(tmp_path)
    (d / "model-00001-of-00001.safetensors").write_bytes(b"")
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": shard}})
    )
    with pytest.raises(SpecError, match=r"index\.json: weight_map must name shard files inside"):
        check_model_dir(d, "spec.model.path")


def test_an_index_of_plain_shard_names_passes(tmp_path):
    d = _model_dir(tmp_path)
    (d / "model-00001-of-00001.safetensors").write_bytes(b"")
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}})
    )
    check_model_dir(d, "spec.model.path")
