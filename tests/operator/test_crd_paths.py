"""Path fields stay inside the run's own volumes (issue 38): ``resumeFrom`` and every other path
of a cluster run is relative to its section's volume, never absolute, never climbing. Refused by
the CRD (CEL: ``kubectl apply`` fails naming the field, nothing is stored) and by the operator's
policy (``PolicyViolation`` naming the field); local ``npu-lora run`` manifests keep local paths."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_lora.api import v1alpha1 as api
from npu_lora_operator import builders
from npu_lora_operator.crd import build_crd, openapi_schema
from npu_lora_operator.policy import PodPolicy, check_spec
from npu_lora_operator.policy.paths import check_paths

schema_mod = pytest.importorskip("npu_lora_sandbox.schema")

BASE: dict[str, Any] = {
    "model": {"path": "qwen3", "tokenizer": "tok", "volume": {"claimName": "models"}},
    "data": {"path": "nsmc/train.tsv", "format": "nsmc", "volume": {"claimName": "data"}},
    "training": {"steps": 10},
    "eval": {"path": "nsmc/test.tsv"},
    "output": {"path": "runs/r1", "volume": {"claimName": "runs"}},
    "resumeFrom": "runs/older",
}

#: (field, value set over BASE, the field the refusal names)
BAD = [
    ("resumeFrom", "/etc", "spec.resumeFrom"),
    ("resumeFrom", "/mnt/output/other", "spec.resumeFrom"),
    ("resumeFrom", "../other-namespace/runs/r1", "spec.resumeFrom"),
    ("resumeFrom", "runs/../../x", "spec.resumeFrom"),
    ("resumeFrom", "..", "spec.resumeFrom"),
    ("resumeFrom", ".", "spec.resumeFrom"),
    ("resumeFrom", "./", "spec.resumeFrom"),
    ("model.path", "/etc", "spec.model.path"),
    ("model.path", "../../pvc/other/models", "spec.model.path"),
    ("model.tokenizer", "/root/.ssh", "spec.model.tokenizer"),
    ("model.tokenizer", "a/../../b", "spec.model.tokenizer"),
    ("data.path", "/etc/shadow", "spec.data.path"),
    ("data.path", "../secret.tsv", "spec.data.path"),
    ("eval.path", "/var/run/secrets/x", "spec.eval.path"),
    ("eval.path", "x/../../y", "spec.eval.path"),
    ("output.path", "/abs/dir", "spec.output.path"),
    ("data.path", "example:../../etc/passwd", "spec.data.path"),
    ("data.path", "example:", "spec.data.path"),
]
#: a path without its volume is a path in the pod's filesystem
NO_VOLUME = [
    ({"model": {"path": "qwen3"}}, "spec.model.path"),
    ({"model": {"preset": "tiny-qwen3-moe", "tokenizer": "tok"}}, "spec.model.tokenizer"),
    ({"data": {"path": "train.tsv"}}, "spec.data.path"),
    ({"data": {"path": "example:nsmc-mini"}, "eval": {"path": "t.tsv"}}, "spec.eval.path"),
]
GOOD = [
    ("resumeFrom", "runs/older"),
    ("resumeFrom", "team/a/..b/...c"),
    ("model.path", "."),
    ("model.path", "models/qwen3/"),
    ("data.path", "example:nsmc-mini"),
    ("data.path", "./nsmc/train.tsv"),
    ("output.path", "team/r1"),
]


def _set(spec: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    cur = spec
    *head, last = path.split(".")
    for k in head:
        cur = cur.setdefault(k, {})
    cur[last] = value
    return spec


def _obj(spec: dict[str, Any], name: str = "r1") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name, "namespace": "default", "uid": "u1"},
        "spec": spec,
    }


def crd_errors(spec: dict[str, Any]) -> list[str]:
    """The sandbox API server's schema + CEL validation of a MoEFinetune with ``spec``."""
    schema = openapi_schema()
    obj = _obj(spec)
    schema_mod.prune(obj, schema)
    schema_mod.apply_defaults(obj, schema)
    causes = schema_mod.validate(obj, schema, old=None, has_old=False)
    return [f"{getattr(c, 'field', '')}: {getattr(c, 'message', c)}" for c in causes]


def policy_fields(spec: dict[str, Any]) -> list[str]:
    run = builders.Run.from_body(_obj(spec))
    return [v.field for v in check_spec(run.spec, PodPolicy(), "w:1")]


@pytest.mark.parametrize(("path", "value", "field"), BAD)
def test_a_path_outside_its_volume_is_refused_by_the_crd_and_the_operator(
    path: str, value: str, field: str
) -> None:
    spec = _set(BASE, path, value)
    errors = crd_errors(spec)
    assert any(field in e for e in errors), errors
    try:
        fields = policy_fields(spec)
    except ValueError as e:  # pydantic refuses some already (output.path: '..', the root)
        assert field.removeprefix("spec.") in str(e)
    else:
        assert fields == [field]


@pytest.mark.parametrize(("over", "field"), NO_VOLUME)
def test_a_path_without_its_volume_is_refused(over: dict[str, Any], field: str) -> None:
    spec = {**copy.deepcopy(BASE), **over}
    spec.pop("resumeFrom")
    if "eval" not in over:
        spec.pop("eval")
    errors = crd_errors(spec)
    assert any(field in e for e in errors), errors
    assert field in policy_fields(spec)
    assert any("volume" in v.message for v in check_paths(builders.Run.from_body(_obj(spec)).spec))


@pytest.mark.parametrize(("path", "value"), GOOD)
def test_paths_inside_their_volume_pass(path: str, value: str) -> None:
    spec = _set(BASE, path, value)
    assert crd_errors(spec) == []
    assert policy_fields(spec) == []


def test_the_examples_pass_and_local_manifests_keep_local_paths() -> None:
    root = Path(__file__).resolve().parents[2]
    for name in ("qwen3-30b-a3b-nsmc.yaml", "tiny-sandbox.yaml"):
        obj = yaml.safe_load((root / "examples" / name).read_text())
        assert crd_errors(obj["spec"]) == [], name
    # npu-lora run (pydantic) still takes a laptop's paths
    local = yaml.safe_load((root / "examples" / "tiny-nsmc-eval.yaml").read_text())
    assert local["spec"]["data"]["path"].startswith("../")
    api.MoEFinetuneSpec.model_validate(local["spec"])


def test_kubectl_apply_of_an_absolute_resume_from_fails_naming_it_and_stores_nothing(
    emulator: Any, kubectl: Any
) -> None:
    emulator.load_crd(build_crd())
    obj = _obj(_set(BASE, "resumeFrom", "/pvc/other-namespace/runs/r1"), "steal")
    del obj["metadata"]["uid"]
    r = kubectl("apply", "-f", "-", input=yaml.safe_dump(obj), check=False)
    assert r.returncode != 0
    assert "spec.resumeFrom" in r.stderr and "relative to the output volume" in r.stderr
    assert emulator.get(api.API_VERSION, api.KIND, "steal", namespace="default") is None
    # a patch to it is refused the same way, and leaves the stored run as it was
    ok = _obj(copy.deepcopy(BASE), "steal")
    del ok["metadata"]["uid"]
    kubectl("apply", "-f", "-", input=yaml.safe_dump(ok))
    r = kubectl(
        "patch",
        "mft",
        "steal",
        "--type=merge",
        "-p",
        '{"spec":{"resumeFrom":"../x/y"}}',
        check=False,
    )
    assert r.returncode != 0 and "spec.resumeFrom" in r.stderr
    stored = emulator.get(api.API_VERSION, api.KIND, "steal", namespace="default")
    assert stored["spec"]["resumeFrom"] == "runs/older"


def test_every_path_field_the_cel_rules_read_is_bounded() -> None:
    """A CEL ``matches`` on an unbounded string is costed at the request size: every path field
    has a maxLength (eval.path had none)."""
    props = openapi_schema()["properties"]["spec"]["properties"]
    for section, field in (
        ("model", "path"),
        ("model", "tokenizer"),
        ("data", "path"),
        ("eval", "path"),
        ("output", "path"),
    ):
        assert props[section]["properties"][field].get("maxLength") == 4096, (section, field)
    assert props["resumeFrom"].get("maxLength") == 4096
    with pytest.raises(ValueError, match="eval"):
        api.MoEFinetuneSpec.model_validate(_set(BASE, "eval.path", "e" * 4097))
