"""The manifest loader: overrides, defaults, and errors that name the field."""

from __future__ import annotations

import pytest
from npu_lora.api.load import SpecError, load_manifest

BASE = {"model": {"preset": "tiny-qwen3-moe"}, "data": {"path": "example:nsmc-mini"}}


def test_bare_spec_gets_defaults_and_overrides():
    m = load_manifest(BASE, ["training.steps=12", "spec.lora.r=8", "lora.targetModules=[q_proj]"])
    assert m.kind == "MoEFinetune"
    assert m.spec.training.steps == 12
    assert m.spec.lora.r == 8
    assert m.spec.lora.target_modules == ["q_proj"]
    assert m.spec.moe.keep_graph is None and m.spec.moe.hot_fraction == 0.25


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("lora.r=0", "spec.lora.r: Input should be greater than or equal to 1 (got 0)"),
        ("lora.rank=3", "spec.lora.rank: unknown field"),
        ("moe.placement=cold", "spec.moe.placement: Input should be 'auto', 'host-only' or"),
        ("moe.hotMemory=12GB", "spec.moe.hotMemory: '12GB' is not a quantity of bytes"),
        ("training.steps=3", "warmupSteps (4) must be less than training.steps (3)"),
        ("training.seqLen=abc", "spec.training.seqLen: Input should be a valid integer"),
        # (lora.trainExperts with placement hot: a two-field rule, tested in test_train_experts_*)
        ("model.path=/m", "set exactly one of model.path or model.preset"),
    ],
)
def test_invalid_field_is_named(override, needle):
    with pytest.raises(SpecError) as e:
        load_manifest(BASE, [override])
    assert needle in str(e.value)


def test_manifest_kind_and_version_are_checked(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("apiVersion: npu-lora.io/v1\nkind: MoEFinetune\nspec: {}\n")
    with pytest.raises(SpecError, match=r"apiVersion: expected 'npu-lora\.io/v1alpha1'"):
        load_manifest(p)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_manifest(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_manifest(bad)


def test_name_defaults_to_file_stem(tmp_path):
    p = tmp_path / "my-run.yaml"
    p.write_text("model: {preset: tiny-qwen3-moe}\ndata: {path: example:nsmc-mini}\n")
    assert load_manifest(p).metadata.name == "my-run"
