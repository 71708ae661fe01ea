"""docs/reference.md's MoEFinetune field reference is generated from the models and must not go stale."""

from __future__ import annotations

from pathlib import Path

from npu_lora.api import reference

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def test_docs_field_reference_matches_models():
    text = REFERENCE.read_text(encoding="utf-8")
    assert reference.splice(text) == text, (
        "docs/reference.md's field reference is stale: run "
        "`python -m npu_lora.api.reference --write docs/reference.md`"
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
