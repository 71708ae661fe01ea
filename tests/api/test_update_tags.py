"""Update semantics are tagged once on the spec model and every consumer derives from the tags."""

from __future__ import annotations

from npu_lora.api import v1alpha1 as api
from npu_lora.train import rundir
from npu_lora_operator.crd import build_crd


def test_every_spec_field_has_exactly_one_update_tag() -> None:
    for name, info in api.MoEFinetuneSpec.model_fields.items():
        tags = [m for m in info.metadata if isinstance(m, api.OnUpdate)]
        assert len(tags) == 1, f"spec.{info.alias or name}: tag it with exactly one OnUpdate"
    every = [f for u in api.OnUpdate for f in api.spec_fields(u)]
    assert sorted(every) == sorted(api.spec_fields())


def test_consumers_read_the_tags() -> None:
    immutable = api.spec_fields(api.OnUpdate.IMMUTABLE)
    assert immutable == ("model", "data", "lora", "moe", "training", "eval")
    assert immutable == rundir.TRAINING_FIELDS
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    transition = [v for v in spec["x-kubernetes-validations"] if "oldSelf" in v["rule"]]
    # the training fields, and managedBy (immutable, but no training field: OnUpdate.NEW_RUN)
    assert transition == [api.immutable_rule(), api.managed_by_rule()]
    for name in immutable:
        assert f"self.{name} == oldSelf.{name}" in transition[0]["rule"]
    # a cluster-only field never reaches `npu-lora run`; the worker needs every training field
    cluster = set(api.spec_fields(cluster_only=True))
    assert not cluster & set(immutable)
    assert {"suspend", "image", "podTemplate"} <= cluster


def test_architecture_page_lists_the_tags() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    for tag in api.OnUpdate:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{tag.value}` |"))
        fields = [f.strip() for f in row.split("|")[2].split(",")]
        assert fields == list(api.spec_fields(tag)), f"docs/architecture.md, row {tag.value}"
