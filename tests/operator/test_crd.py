"""The CRD generated from the models: fresh on disk, structural, valid, printer columns, CEL."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_lora.api import v1alpha1 as api
from npu_lora_operator.crd import (
    CRD_FILENAME,
    build_crd,
    crd_yaml,
    default_crd_path,
    is_stale,
    openapi_schema,
    write_crd,
)

ROOT = Path(__file__).resolve().parents[2]
REGEN = f"npu-lora crd --write crds/{CRD_FILENAME}"


def test_crds_dir_is_fresh() -> None:
    path = ROOT / "crds" / CRD_FILENAME
    assert path == default_crd_path()
    assert not is_stale(path), f"{path} is stale; regenerate with: {REGEN}"


def test_chart_copy_is_fresh_when_present() -> None:
    path = ROOT / "charts" / "npu-lora-operator" / "crds" / CRD_FILENAME
    if not path.exists():
        pytest.skip("no chart copy yet")
    assert not is_stale(path), (
        f"{path} is stale; regenerate with: npu-lora crd --write {path.relative_to(ROOT)}"
    )


def test_cli_print_write_check(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "npu_lora.cli", "crd"], capture_output=True, text=True, check=True
    )
    assert out.stdout == crd_yaml()
    target = tmp_path / "crd.yaml"
    check = [sys.executable, "-m", "npu_lora.cli", "crd", "--check", str(target)]
    r = subprocess.run(check, capture_output=True, text=True)
    assert r.returncode == 1 and "npu-lora crd --write" in r.stderr
    subprocess.run(
        [sys.executable, "-m", "npu_lora.cli", "crd", "--write", str(target)], check=True
    )
    assert subprocess.run(check).returncode == 0
    assert write_crd(target) is False  # unchanged


def test_crd_shape() -> None:
    crd = build_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "moefinetunes.npu-lora.io"
    assert spec["group"] == api.GROUP and spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["mft"]
    assert spec["names"]["kind"] == "MoEFinetune" and spec["names"]["plural"] == "moefinetunes"
    assert spec["names"]["categories"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    cols = build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    by_name = {c["name"].upper(): c for c in cols}
    default = [c["name"].upper() for c in cols if not c.get("priority")]
    wide = [c["name"].upper() for c in cols if c.get("priority") == 1]
    assert default == [
        "PHASE",
        "PROGRESS",
        "STEP",
        "LOSS",
        "S/STEP",
        "ATTN",
        "HOST-FWD",
        "HOST-BWD",
        "HOT",
        "EVAL",
        "AGE",
    ]
    assert wide == [
        "TOTAL",
        "ACC",
        "ETA",
        "NODE",
        "CALLS/LAYER",
        "COPY-MB",
        "EXPERT-BYTES",
        "NODE-EXPERT-BYTES",
        "VARIANTS",
        "ROUNDS",
        "BEST",
        "RATIO",
        "COMPILED",
        "GRAPHS",
    ]
    assert by_name["COPY-MB"]["jsonPath"] == ".status.lastStep.copyMb"
    assert by_name["EXPERT-BYTES"] == {**by_name["EXPERT-BYTES"], "type": "integer"}
    assert by_name["EXPERT-BYTES"]["jsonPath"] == ".status.lastStep.expertBytes"
    assert by_name["NODE-EXPERT-BYTES"]["jsonPath"] == ".status.lastStep.nodeExpertBytes"
    assert by_name["STEP"]["jsonPath"] == ".status.progress.step"
    # Kubeflow Trainer's column (KEP-2779), from the column registry
    assert by_name["PROGRESS"]["jsonPath"] == ".status.trainerStatus.progressPercentage"
    assert by_name["PROGRESS"]["type"] == "integer"
    assert by_name["LOSS"]["jsonPath"] == ".status.lastStep.loss"
    assert by_name["S/STEP"]["jsonPath"] == ".status.stepSecondsMedian"
    assert by_name["ATTN"]["jsonPath"] == ".status.lastStep.attnHeadS"
    assert by_name["HOST-FWD"]["jsonPath"] == ".status.lastStep.hostFwdS"
    assert by_name["HOST-BWD"]["jsonPath"] == ".status.lastStep.hostBwdS"
    assert by_name["HOT"]["jsonPath"] == ".status.hot.experts"
    assert by_name["AGE"] == {**by_name["AGE"], "type": "date"}
    assert by_name["CALLS/LAYER"]["jsonPath"] == ".status.lastStep.deviceCallsPerLayer"
    assert by_name["NODE"]["jsonPath"] == ".status.nodeName"
    assert by_name["EVAL"]["jsonPath"] == ".status.eval.loss"
    assert by_name["ACC"]["jsonPath"] == ".status.eval.accuracy"
    # every column points at a field of the schema
    schema = openapi_schema()
    for c in cols:
        node = schema
        for part in c["jsonPath"].lstrip(".").split("."):
            if part in ("metadata",):
                node = None
                break
            node = node["properties"][part]
        if node is not None:
            assert node["type"] == c["type"], c


def _walk(node: dict[str, Any], path: str = ""):
    yield path, node
    for k, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{k}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")


def test_structural_schema() -> None:
    schema = openapi_schema()
    text = yaml.safe_dump(schema)
    assert "$ref" not in text and "title" not in schema and "anyOf: [null" not in text
    for path, node in _walk(schema):
        assert "$ref" not in node and "allOf" not in node and "oneOf" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}]
            continue
        assert node.get("type") in ("object", "array", "string", "integer", "number", "boolean"), (
            path
        )
        if node["type"] == "array":
            assert "items" in node, path
        if path.count(".") >= 1 and path not in (".metadata",):
            assert node.get("description") or path.endswith("[]") or path.endswith(".*"), path
        if isinstance(node.get("exclusiveMinimum"), bool):
            assert "minimum" in node, path


def test_every_model_field_is_described() -> None:
    schema = openapi_schema()
    for path, node in _walk(schema):
        if path and path != ".metadata" and not path.endswith(("[]", ".*")):
            assert node.get("description"), f"{path}: no description"
    # the apiserver allows nothing but `type` on the root metadata
    assert schema["properties"]["metadata"] == {"type": "object"}


def test_schema_details() -> None:
    spec = openapi_schema()["properties"]["spec"]
    p = spec["properties"]
    assert p["lora"]["properties"]["r"] == {
        "description": "LoRA rank.",
        "default": 16,
        "maximum": 1024,
        "minimum": 1,
        "type": "integer",
    }
    assert p["lora"]["default"] == {}  # nested defaults filled by the apiserver
    assert p["lora"]["properties"]["targetModules"]["default"] == ["q_proj", "v_proj"]
    assert p["moe"]["properties"]["placement"]["enum"] == ["auto", "host-only", "hot"]
    assert p["moe"]["properties"]["placement"]["default"] == "auto"
    assert p["moe"]["properties"]["hotMemory"]["pattern"].startswith("^[0-9]+")
    hot = p["moe"]["properties"]["hotFraction"]
    assert hot["minimum"] == 0 and hot["exclusiveMinimum"] is True and hot["maximum"] == 1
    # Optional with a non-null default keeps null meaningful
    assert p["training"]["properties"]["maxGradNorm"]["nullable"] is True
    # Optional without a default: plain optional, no nullable
    assert "nullable" not in p["model"]["properties"]["layers"]
    assert p["podTemplate"]["properties"]["affinity"]["x-kubernetes-preserve-unknown-fields"]
    tol = p["podTemplate"]["properties"]["tolerations"]["items"]
    assert tol["x-kubernetes-preserve-unknown-fields"]
    req = p["resources"]["properties"]["requests"]["additionalProperties"]
    assert req["x-kubernetes-int-or-string"] is True
    assert set(spec["required"]) == {"model", "data"}
    rules = [v["rule"] for v in spec["x-kubernetes-validations"]]
    assert any("oldSelf" in r for r in rules)  # the transition rule lives on spec
    for path, node in _walk(openapi_schema()):
        for v in node.get("x-kubernetes-validations") or []:
            if "oldSelf" in v["rule"]:
                assert path == ".spec", path
    conds = openapi_schema()["properties"]["status"]["properties"]["conditions"]
    assert conds["x-kubernetes-list-type"] == "map"
    assert conds["x-kubernetes-list-map-keys"] == ["type"]


def test_crd_validates_against_kubernetes_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    kv.validate(build_crd(), "1.32.0", strict=True)


def test_cel_rules_compile() -> None:
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    n = 0
    for _, node in _walk(openapi_schema()):
        for v in node.get("x-kubernetes-validations") or []:
            env.compile(v["rule"])
            assert v["message"]
            n += 1
    assert n >= 5


# -- the schema as the apiserver applies it (the emulator's structural schema code) ---------

schema_mod = pytest.importorskip("npu_lora_sandbox.schema")


def _admit(obj: dict[str, Any], old: dict[str, Any] | None = None) -> tuple[list[str], list[str]]:
    schema = openapi_schema()
    obj = copy.deepcopy(obj)
    unknown = schema_mod.prune(obj, schema)
    schema_mod.apply_defaults(obj, schema)
    if old is not None:
        old = copy.deepcopy(old)
        schema_mod.prune(old, schema)
        schema_mod.apply_defaults(old, schema)
    causes = schema_mod.validate(obj, schema, old=old, has_old=old is not None)
    return unknown, [
        str(getattr(c, "message", c)) + " " + str(getattr(c, "field", "")) for c in causes
    ]


def _example() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / "tiny-sandbox.yaml").read_text())


def test_example_is_admitted_and_agrees_with_pydantic() -> None:
    unknown, errors = _admit(_example())
    assert unknown == [] and errors == []
    from npu_lora.api.load import load_manifest

    load_manifest(ROOT / "examples" / "tiny-sandbox.yaml")


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        ("lora.r", 0, "spec.lora.r"),
        ("lora.r", "eight", "spec.lora.r"),
        ("moe.placement", "gpu", "spec.moe.placement"),
        ("moe.hotFraction", 0, "spec.moe.hotFraction"),
        ("training.steps", 0, "spec.training.steps"),
        ("moe.warmupSteps", 100, "warmupSteps"),
        ("device.backend", "tpu", "spec.device.backend"),
    ],
)
def test_invalid_values_rejected(path: str, value: Any, needle: str) -> None:
    obj = _example()
    cur = obj["spec"]
    *head, last = path.split(".")
    for k in head:
        cur = cur.setdefault(k, {})
    cur[last] = value
    _, errors = _admit(obj)
    assert errors and any(needle in e for e in errors), errors


def test_unknown_field_pruned() -> None:
    obj = _example()
    obj["spec"]["lora"]["rank"] = 8
    unknown, _ = _admit(obj)
    assert unknown == [".spec.lora.rank"] or any("lora.rank" in u for u in unknown)


def test_immutable_training_transition_rule() -> None:
    old = _example()
    new = copy.deepcopy(old)
    new["spec"]["training"]["steps"] = 99
    _, errors = _admit(new, old)
    assert any("immutable" in e for e in errors), errors
    ok = copy.deepcopy(old)
    ok["spec"]["suspend"] = True
    ok["spec"]["reporting"]["everySteps"] = 5
    assert _admit(ok, old)[1] == []


@pytest.mark.parametrize(
    ("moe", "lora", "steps", "ok"),
    [
        ({"placement": "auto", "warmupSteps": 4}, {}, 10, True),
        ({"placement": "auto", "warmupSteps": 10}, {}, 10, False),  # auto needs a hot step
        ({"warmupSteps": 10}, {}, 10, False),  # the default is auto
        ({"placement": "host-only", "warmupSteps": 10}, {}, 10, True),
        ({"placement": "auto", "warmupSteps": 0}, {"trainExperts": True}, 10, True),
        ({"warmupSteps": 0}, {"trainExperts": True}, 10, True),  # default auto: host-only
        ({"placement": "hot", "warmupSteps": 0}, {"trainExperts": True}, 10, False),
        ({"hotMemory": "12Gi"}, {}, 10, True),
        ({"hotMemory": "12 GB"}, {}, 10, False),
    ],
)
def test_placement_rules_agree_with_pydantic(moe, lora, steps, ok) -> None:
    """CEL (the apiserver) and pydantic (``npu-lora run``) treat placement auto the same."""
    from npu_lora.api.v1alpha1 import MoEFinetuneSpec
    from pydantic import ValidationError

    obj = _example()
    obj["spec"]["moe"] = dict(moe)
    obj["spec"].setdefault("lora", {}).update(lora)
    obj["spec"]["training"]["steps"] = steps
    obj["spec"].pop("benchmark", None)
    _, errors = _admit(obj)
    assert (errors == []) is ok, errors
    try:
        MoEFinetuneSpec.model_validate(obj["spec"])
        valid = True
    except ValidationError:
        valid = False
    assert valid is ok


# -- formats (issue 28): the CRD and pydantic refuse the same values ----------------------------


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    cur = obj["spec"]
    *head, last = path.split(".")
    for k in head:
        cur = cur.setdefault(k, {})
    cur[last] = value
    return obj


def _pydantic_ok(obj: dict[str, Any]) -> bool:
    try:
        api.MoEFinetuneSpec.model_validate(obj["spec"])
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("output.volume", {"claimName": "Not_A_DNS_Name"}),
        ("output.volume", {"claimName": "../../etc"}),
        ("output.volume", {"claimName": "a" * 254}),
        ("output.volume", {"hostPath": "relative/dir"}),
        ("output.volume", {"claimName": "runs", "subPath": "../up"}),
        ("output.volume", {"claimName": "runs", "subPath": "a/../../b"}),
        ("output.volume", {"claimName": "runs", "subPath": "/abs"}),
        ("output.volume", {"claimName": "runs", "subPath": ".."}),
        ("resources", {"requests": {"cpu": "lots"}}),
        ("resources", {"limits": {"memory": "-5Gi"}}),
        ("resources", {"requests": {"cpu": -1}}),
        ("resources", {"requests": {"memory": "1 Gi"}}),
        ("queueName", "team queue"),
        ("queueName", "-leading"),
        ("queueName", "q" * 64),
        ("image", "x" * 513),
        ("image", "evil image:1"),
        ("image", "img\n:1"),
        ("device", {"backend": "furiosa", "cards": 0}),
        ("device", {"backend": "cuda", "cards": 0}),
        ("podTemplate", {"priorityClassName": "System Critical"}),
        ("podTemplate", {"serviceAccountName": "../default"}),
        ("podTemplate", {"tolerations": [{"key": "k"}] * 33}),
        ("output.path", "p" * 5000),
        ("output.path", "."),
        ("output.path", "./"),
        ("output.path", "runs/../.."),
        ("data.template", "{text}" * 1000),
        ("lora.targetModules", ["q" * 200]),
    ],
)
def test_bad_formats_refused_by_crd_and_pydantic(path: str, value: Any) -> None:
    obj = _set(_example(), path, value)
    _, errors = _admit(obj)
    assert errors, f"the CRD admits {path}={str(value)[:80]}"
    assert not _pydantic_ok(obj), f"pydantic admits {path}={str(value)[:80]}"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("output.volume", {"claimName": "runs.v2", "subPath": "team/a/..b/...c/.d"}),
        ("resources", {"requests": {"cpu": "500m", "memory": "64Gi"}, "limits": {"cpu": 8}}),
        ("resources", {"requests": {"cpu": "1.5", "memory": "1e9"}}),
        ("queueName", "team-a.q_1"),
        ("image", "registry.example.com:5000/team/worker@sha256:" + "a" * 64),
        ("device", {"backend": "cpu", "cards": 0}),
        ("device", {"backend": "furiosa", "cards": 2}),
    ],
)
def test_good_formats_pass_both(path: str, value: Any) -> None:
    obj = _set(_example(), path, value)
    _, errors = _admit(obj)
    assert errors == []
    assert _pydantic_ok(obj)


@pytest.mark.parametrize(
    ("training", "moe", "eval_", "ok"),
    [
        ({"epochs": 2}, {"placement": "hot", "warmupSteps": 4}, None, True),
        ({"epochs": 2, "steps": 10}, {}, None, False),  # exactly one of steps, epochs
        ({"warmupRatio": 0.1, "warmupSteps": 2, "steps": 10}, {}, None, False),
        ({"scheduler": "cosine", "warmupRatio": 0.1, "steps": 10}, {}, None, True),
        ({"scheduler": "exponential", "steps": 10}, {}, None, False),
        ({}, {"placement": "hot", "warmupSteps": 50}, None, True),  # default: 100 steps
        ({}, {"placement": "hot", "warmupSteps": 100}, None, False),
        ({"steps": 10}, {}, {"path": "test.tsv", "everySteps": 5}, True),
        ({"steps": 10}, {}, {"fraction": 0.1}, True),
        ({"steps": 10}, {}, {"fraction": 0.1, "path": "t.tsv"}, False),
        ({"steps": 10}, {}, {"everySteps": 5}, False),
        ({"steps": 10}, {}, {"fraction": 1.0}, False),
    ],
)
def test_schedule_and_eval_rules_agree_with_pydantic(training, moe, eval_, ok) -> None:
    """training.steps|epochs, warmupRatio|warmupSteps, eval.path|fraction: CEL == pydantic."""
    from npu_lora.api.v1alpha1 import MoEFinetuneSpec
    from pydantic import ValidationError

    obj = _example()
    obj["spec"]["training"] = {
        k: v for k, v in obj["spec"]["training"].items() if k not in ("steps", "epochs")
    }
    obj["spec"]["training"].update(training)
    obj["spec"]["moe"] = {"placement": "host-only", **moe}
    if eval_ is not None:
        obj["spec"]["eval"] = eval_
        if "path" in eval_:  # a cluster's eval file is on the data volume (issue 38)
            obj["spec"]["data"] = {"path": "train.tsv", "volume": {"claimName": "data"}}
    obj["spec"].pop("benchmark", None)
    _, errors = _admit(obj)
    assert (errors == []) is ok, errors
    try:
        MoEFinetuneSpec.model_validate(obj["spec"])
        valid = True
    except ValidationError:
        valid = False
    assert valid is ok


def test_eval_is_immutable_whether_added_changed_or_removed() -> None:
    old = _example()
    old["spec"].pop("eval", None)
    with_eval = copy.deepcopy(old)
    with_eval["spec"]["eval"] = {"fraction": 0.1}
    assert _admit(with_eval)[1] == []
    assert any("immutable" in e for e in _admit(with_eval, old)[1])  # added
    assert any("immutable" in e for e in _admit(old, with_eval)[1])  # removed
    changed = copy.deepcopy(with_eval)
    changed["spec"]["eval"]["fraction"] = 0.2
    assert any("immutable" in e for e in _admit(changed, with_eval)[1])
    assert _admit(copy.deepcopy(with_eval), with_eval)[1] == []


def test_keep_graph_is_an_optional_boolean_in_the_emulator_schema() -> None:
    """``moe.keepGraph`` takes true and false, omitted means auto; a word is refused."""
    from npu_lora_sandbox.schema import validate

    schema = openapi_schema()
    node = schema["properties"]["spec"]["properties"]["moe"]["properties"]["keepGraph"]
    assert node["type"] == "boolean" and "default" not in node
    for ok in (True, False):
        assert not validate(ok, node), ok
    assert validate("auto", node)
