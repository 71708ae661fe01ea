"""The emulator refuses what a kube-apiserver refuses, for the same reasons (issue 44): a CRD
whose CEL rules exceed the apiserver's estimated cost budget, and a built-in object without a
required field the apiserver does not default. A refused object is not stored."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from npu_lora_operator import builders, precompile
from npu_lora_operator.settings import OperatorConfig
from npu_lora_sandbox import celcost
from npu_lora_sandbox.emulator import ApiEmulator, ApiError


def crd_with(schema_spec: dict[str, Any], make_crd: Any) -> dict[str, Any]:
    return make_crd(
        schema={
            "type": "object",
            "properties": {"spec": schema_spec},
        },
        printer_columns=[],
    )


#: a 160-character regex: ceil(160 × 0.25) = 40 × ceil((3 MiB − 1) × 0.1) ≈ 12.6 M > 10 M
LONG_RX = ("^(" + "|".join(f"v{i:02d}[a-z]{{1,4}}" for i in range(16)) + ")$")[:158] + ")$"


def expensive(max_length: int | None) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string"}
    if max_length is not None:
        s["maxLength"] = max_length
    return {
        "type": "object",
        "properties": {"s": s},
        "x-kubernetes-validations": [{"rule": f"self.s.matches('{LONG_RX}')", "message": "s"}],
    }


def test_a_crd_over_the_per_rule_budget_is_refused_naming_the_rule(
    api_client: Any, emulator: ApiEmulator, make_crd: Any
) -> None:
    assert len(LONG_RX) == 160
    ext = client.ApiextensionsV1Api(api_client)
    with pytest.raises(ApiException) as e:
        ext.create_custom_resource_definition(crd_with(expensive(None), make_crd))
    assert e.value.status == 422
    status = json.loads(e.value.body)
    assert status["reason"] == "Invalid"
    (rule,) = celcost.rule_costs(expensive(None), conservative=False)
    factor = rule.cost / celcost.STATIC_ESTIMATED_COST_LIMIT  # Go %f under 1.5x
    assert rule.cost == 40 * -(-(celcost.MAX_REQUEST_SIZE_BYTES - 1) // 10) + 2
    assert status["message"].startswith(
        'CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: '
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0]"
        f".rule: Forbidden: estimated rule cost exceeds budget by factor of {factor:f}x (try "
        "simplifying the rule, or adding maxItems, maxProperties, and maxLength"
    ), status["message"]
    # nothing was stored: the resource is not served
    with pytest.raises(ApiException) as e:
        ext.read_custom_resource_definition("widgets.example.com")
    assert e.value.status == 404
    # bounded, the same rule costs 40 × ceil((4 × 64 + 1) × 0.1) + 2 and is accepted
    crd = ext.create_custom_resource_definition(crd_with(expensive(64), make_crd))
    assert crd.metadata.uid


def test_a_crd_over_the_total_budget_is_refused(emulator: ApiEmulator, make_crd: Any) -> None:
    """Each rule under StaticEstimatedCostLimit, together over StaticEstimatedCRDCostLimit."""
    one = {
        "rule": f"self.s.matches('{LONG_RX[:90]}')",
        "message": "s",
    }
    spec = expensive(None)
    spec["x-kubernetes-validations"] = [copy.deepcopy(one) for _ in range(14)]
    (cost, *_) = [c.cost for c in celcost.rule_costs(spec, conservative=False)]
    assert cost < celcost.STATIC_ESTIMATED_COST_LIMIT < 14 * cost
    assert 14 * cost > celcost.STATIC_ESTIMATED_CRD_COST_LIMIT
    with pytest.raises(ApiError) as e:
        emulator.load_crd(crd_with(spec, make_crd))
    assert e.value.code == 422
    assert (
        "spec.versions[0].schema.openAPIV3Schema: Forbidden: x-kubernetes-validations estimated "
        "rule cost total for entire OpenAPIv3 schema exceeds budget" in e.value.message
    )


def test_the_project_crd_is_accepted(emulator: ApiEmulator) -> None:
    from npu_lora_operator.crd import build_crd

    assert emulator.load_crd(build_crd())["metadata"]["uid"]


# -- required fields of the built-in kinds -----------------------------------------------------


def _children() -> list[dict[str, Any]]:
    body = {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": "r1", "namespace": "default", "uid": "u-1"},
        "spec": {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "example:nsmc-mini"},
            "device": {
                "backend": "furiosa",
                "cards": 2,
                "precompile": True,
                "compileCache": {"claimName": "graphs"},
            },
            "distributed": {"workers": 2},
        },
    }
    children, _ = precompile.run_children(builders.Run.from_body(body), OperatorConfig())
    return children


def test_every_child_the_operator_builds_is_admitted(emulator: ApiEmulator) -> None:
    kinds = []
    for child in _children():
        child = copy.deepcopy(child)
        child["metadata"].pop("ownerReferences")  # no owner object here
        kinds.append(emulator.create(child)["kind"])
    assert sorted(kinds) == sorted(
        ["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Service", "Job", "Job"]
    )


def _child(kind: str, name: str | None = None) -> dict[str, Any]:
    for c in _children():
        if c["kind"] == kind and (name is None or c["metadata"]["name"] == name):
            c = copy.deepcopy(c)
            c["metadata"].pop("ownerReferences")
            return c
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "path", "field"),
    [
        ("Job", ("spec", "podFailurePolicy", "rules", 0, "action"), None),
        ("Job", ("spec", "podFailurePolicy", "rules", 0, "onExitCodes", "operator"), None),
        ("Job", ("spec", "template", "spec", "volumes", 0, "name"), None),
        (
            "Job",
            ("spec", "template", "spec", "containers", 0, "volumeMounts", 1, "mountPath"),
            None,
        ),
        ("Job", ("spec", "template", "spec", "containers", 0, "env", 0, "name"), None),
        ("Job", ("spec", "template", "spec", "securityContext", "seccompProfile", "type"), None),
        ("RoleBinding", ("roleRef", "name"), None),
        ("RoleBinding", ("subjects", 0, "kind"), None),
        ("Role", ("rules", 0, "verbs"), None),
        ("Service", ("spec", "ports", 0, "port"), None),
    ],
)
def test_a_missing_required_field_is_refused_and_nothing_is_stored(
    emulator: ApiEmulator, kind: str, path: tuple, field: None
) -> None:
    obj = _child(kind, "r1" if kind == "Job" else None)
    cur: Any = obj
    for key in path[:-1]:
        cur = cur[key]
    del cur[path[-1]]
    shown = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")
    with pytest.raises(ApiError) as e:
        emulator.create(obj)
    assert e.value.code == 422
    assert f"{shown}: Required value" in e.value.message, e.value.message
    assert emulator.get(obj["apiVersion"], kind, obj["metadata"]["name"], "default") is None


def test_pod_condition_status_is_defaulted_not_required(emulator: ApiEmulator) -> None:
    """The apiserver defaults ``onPodConditions[].status`` to True (the Job the operator built
    before issue 44 relied on it); the emulator does the same."""
    job = _child("Job", "r1")
    rule = job["spec"]["podFailurePolicy"]["rules"][1]
    del rule["onPodConditions"][0]["status"]
    stored = emulator.create(job)
    (pattern,) = stored["spec"]["podFailurePolicy"]["rules"][1]["onPodConditions"]
    assert pattern == {"type": "DisruptionTarget", "status": "True"}


@pytest.mark.parametrize(
    ("device", "needle"),
    [
        ({"precompile": True}, "device.compileCache"),
        (
            {"precompile": "true", "compileCache": {"claimName": "graphs"}},
            "spec.device.precompile in body must be of type boolean",
        ),
    ],
)
def test_an_apply_of_a_bad_precompile_is_refused_naming_the_field(
    emulator: ApiEmulator, device: dict[str, Any], needle: str
) -> None:
    from npu_lora_operator.crd import build_crd

    emulator.load_crd(build_crd())
    run = {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": "pc", "namespace": "default"},
        "spec": {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "example:nsmc-mini"},
            "device": {"backend": "cpu", "cards": 0, **device},
        },
    }
    with pytest.raises(ApiError) as e:
        emulator.create(run)
    assert e.value.code == 422 and needle in e.value.message, e.value.message
    assert e.value.message.startswith('MoEFinetune.npu-lora.io "pc" is invalid: spec.device')
    assert emulator.get("npu-lora.io/v1alpha1", "MoEFinetune", "pc", "default") is None


SCHEMA_FILES = {
    ("batch", "Job"): "job-batch-v1.json",
    ("", "Pod"): "pod-v1.json",
    ("", "Service"): "service-v1.json",
    ("rbac.authorization.k8s.io", "Role"): "role-rbac-v1.json",
    ("rbac.authorization.k8s.io", "ClusterRole"): "clusterrole-rbac-v1.json",
    ("rbac.authorization.k8s.io", "RoleBinding"): "rolebinding-rbac-v1.json",
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): "clusterrolebinding-rbac-v1.json",
}


@pytest.mark.parametrize("minor", range(30, 38))
def test_every_required_field_is_required_by_the_published_schema(minor: int) -> None:
    """Each entry of the emulator's table is in the ``required`` list of its object in
    Kubernetes' published OpenAPI schema (kubernetes-validate's copy) for every minor the
    chart supports: the emulator refuses nothing a cluster accepts."""
    from pathlib import Path

    from npu_lora_sandbox.admission import REQUIRED_FIELDS

    kv = pytest.importorskip("kubernetes_validate")
    root = Path(kv.__file__).parent / "kubernetes-json-schema" / f"v1.{minor}.0-local-strict"
    defs = json.loads((root / "_definitions.json").read_text())["$defs"]

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        return node

    assert set(REQUIRED_FIELDS) == set(SCHEMA_FILES)
    for key, patterns in REQUIRED_FIELDS.items():
        top = json.loads((root / SCHEMA_FILES[key]).read_text())
        for pattern in patterns:
            node, *parts = [resolve(top), *pattern.split(".")]
            for part in parts[:-1]:
                node = resolve(node["properties"][part.removesuffix("[]")])
                if part.endswith("[]"):
                    node = resolve(node["items"])
            assert parts[-1] in (node.get("required") or []), (minor, key, pattern)
