"""Every object we ship or build, against Kubernetes' published schemas (issue 44).

No kube-apiserver runs here; what can be checked offline is the objects' shape. For every
Kubernetes minor the chart claims (``kubeVersion`` in Chart.yaml, stated in docs/operator.md),
``kubernetes-validate --strict`` (its bundled OpenAPI schemas, no network) must accept:

- every child the operator creates (ConfigMap, ServiceAccount, Role, RoleBinding, the headless
  Service, the precompile Job, the training Job: :func:`npu_lora_operator.precompile.run_children`,
  what ``ensure_run`` creates) for a matrix of specs: every example, each backend, data
  parallel, precompile, benchmark, a full ``podTemplate``, claims and hostPaths with subPaths;
- every object the chart renders with each ``ci/*-values.yaml``, and the CRD.

The Job the operator built before this test (``podFailurePolicy`` ``onPodConditions`` without
``status``) failed it for 1.30–1.33, where the published schema marks ``status`` required.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_util import CHART, REPO, objects, render

kv = pytest.importorskip("kubernetes_validate")

from npu_lora_operator import builders, precompile  # noqa: E402
from npu_lora_operator.crd import build_crd  # noqa: E402
from npu_lora_operator.settings import OperatorConfig  # noqa: E402

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def supported_minors() -> list[str]:
    """``>=1.A.0-0 <1.B.0-0`` in Chart.yaml → ``["1.A", ..., "1.(B-1)"]``."""
    text = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    m = re.fullmatch(r">=1\.(\d+)\.0-0 <1\.(\d+)\.0-0", text)
    assert m, f"Chart.yaml kubeVersion {text!r}: state a closed range >=1.A.0-0 <1.B.0-0"
    return [f"1.{n}" for n in range(int(m.group(1)), int(m.group(2)))]


MINORS = supported_minors()


def validate(obj: dict[str, Any], minor: str) -> None:
    try:
        kv.validate(obj, f"{minor}.0", strict=True)
    except kv.ValidationError as e:
        where = "/".join(str(p) for p in e.path)
        name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        raise AssertionError(
            f"{name} invalid for Kubernetes {minor} at {where!r}: {str(e.message)[:400]}"
        ) from None


def test_the_validator_ships_every_supported_minor_offline() -> None:
    """kubernetes-validate carries its schemas; a minor it lacks would be skipped silently."""
    have = set(kv.utils.all_versions())
    assert MINORS and all(f"{m}.0" in have for m in MINORS), (MINORS, sorted(have))


def test_the_supported_range_is_stated_in_the_docs() -> None:
    text = (REPO / "docs" / "operator.md").read_text()
    assert f"Kubernetes {MINORS[0]}–{MINORS[-1]}" in text


# -- the matrix of specs -----------------------------------------------------------------------

CLAIM = {"claimName": "models", "subPath": "qwen3", "readOnly": True}
TINY: dict[str, Any] = {
    "model": {"preset": "tiny-qwen3-moe"},
    "data": {"path": "example:nsmc-mini"},
    "training": {"steps": 10, "seqLen": 32},
}
POD_TEMPLATE = {
    "nodeSelector": {"furiosa.ai/rngd": "true"},
    "tolerations": [{"key": "furiosa.ai/rngd", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "priorityClassName": "training",
    "imagePullSecrets": [{"name": "regcred"}],
    "env": [
        {"name": "EXTRA", "value": "1"},
        {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
    ],
    "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "cm"}}],
    "volumes": [{"name": "extra", "configMap": {"name": "cm"}}],
    "volumeMounts": [{"name": "extra", "mountPath": "/mnt/extra", "readOnly": True}],
}


def _spec(**over: Any) -> dict[str, Any]:
    spec = copy.deepcopy(TINY)
    spec.update(copy.deepcopy(over))
    return spec


SPECS: dict[str, dict[str, Any]] = {
    **{f"example:{p.stem}": yaml.safe_load(p.read_text())["spec"] for p in EXAMPLES},
    **{
        f"backend:{b}": _spec(device={"backend": b, "cards": c})
        for b, c in (("cpu", 0), ("cuda", 1), ("furiosa", 2), ("auto", 1))
    },
    "distributed": _spec(
        device={"backend": "furiosa", "cards": 2},
        distributed={"workers": 3, "ranksPerWorker": 2},
        queueName="team-a",
    ),
    "precompile": _spec(
        device={
            "backend": "furiosa",
            "cards": 1,
            "precompile": True,
            "compileCache": {"hostPath": "/var/cache/npu", "subPath": "graphs"},
        },
    ),
    "benchmark": _spec(
        benchmark={"variants": ["host-only", "hot"], "rounds": 2},
        device={"backend": "cpu", "cards": 0},
    ),
    "pod-template": _spec(
        podTemplate=POD_TEMPLATE,
        resources={"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "24Gi"}},
        image="registry.example.com/npu-lora-worker:1",
        activeDeadlineSeconds=3600,
        ttlSecondsAfterFinished=600,
        suspend=True,
        backoffLimit=1,
    ),
    "own-service-account": _spec(podTemplate={"serviceAccountName": "trainer"}),
    "volumes": _spec(
        model={"path": "qwen3", "volume": CLAIM},
        data={"path": "train.jsonl", "volume": {"hostPath": "/data", "subPath": "nsmc"}},
        output={"path": "runs/a", "volume": {"claimName": "runs"}},
    ),
}


def children(spec: dict[str, Any]) -> list[dict[str, Any]]:
    body = {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": "run-1", "namespace": "ml", "uid": "6f1c2b3a-0000-4000-8000-1"},
        "spec": spec,
    }
    out, _ = precompile.run_children(builders.Run.from_body(body), OperatorConfig())
    return out


def test_the_matrix_builds_every_kind_of_child() -> None:
    kinds = {(c["kind"], c["metadata"]["name"]) for s in SPECS.values() for c in children(s)}
    want = {
        ("ConfigMap", "run-1-config"),
        ("ServiceAccount", "run-1-worker"),
        ("Role", "run-1-worker"),
        ("RoleBinding", "run-1-worker"),
        ("Service", "run-1-dp"),
        ("Job", "run-1-compile"),
        ("Job", "run-1"),
    }
    assert kinds == want


@pytest.mark.parametrize("minor", MINORS)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_child_the_operator_builds_is_valid(name: str, minor: str) -> None:
    for child in children(SPECS[name]):
        validate(child, minor)


# -- the chart --------------------------------------------------------------------------------

VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
#: kinds of other projects' CRDs (no published Kubernetes schema): the Prometheus Operator's
#: ServiceMonitor of `metrics.serviceMonitor`
FOREIGN = {"monitoring.coreos.com/v1"}


@pytest.mark.parametrize("minor", MINORS)
@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_chart_object_is_valid(values: Path, minor: str) -> None:
    objs = objects(render(yaml.safe_load(values.read_text()) or {}))
    assert objs
    for obj in objs:
        if obj["apiVersion"] not in FOREIGN:
            validate(obj, minor)


@pytest.mark.parametrize("minor", MINORS)
def test_the_crd_is_valid(minor: str) -> None:
    validate(build_crd(), minor)
