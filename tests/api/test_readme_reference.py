"""README's MoEFinetune field reference is generated from the models and must not go stale."""

from __future__ import annotations

from pathlib import Path

from npu_lora.api import reference

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_field_reference_matches_models():
    text = README.read_text(encoding="utf-8")
    assert reference.splice(text) == text, (
        "README.md's field reference is stale: run `python -m npu_lora.api.reference --write README.md`"
    )


def test_reference_lists_every_spec_field_with_a_description():
    rendered = reference.render()
    for path in (
        "spec.moe.keepGraph",
        "spec.moe.hotFraction",
        "spec.training.seqLen",
        "spec.lora.r",
    ):
        assert f"`{path}`" in rendered
    for line in rendered.splitlines()[2:]:
        assert not line.rstrip().endswith("|  |"), f"field without description: {line}"
