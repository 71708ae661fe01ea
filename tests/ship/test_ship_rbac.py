"""The chart's RBAC: its shape in both watch modes, and the RBAC escalation rule.

Whether the ClusterRole grants exactly what the operator uses is checked where the operator really
runs: tests/e2e/test_rbac.py runs it under this ClusterRole against the API emulator, which
records every authorization decision; that test fails when a request is denied or when a granted
permission is neither used nor listed with a reason.
"""

from __future__ import annotations

import pytest
from chart_util import NAMESPACE, by_kind, objects, render

pytest.importorskip("helm_python")

WATCHED = ["team-a", "team-b"]

Perm = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def _rules_to_perms(rules: list[dict]) -> set[Perm]:
    out = set()
    for r in rules:
        assert "*" not in r.get("apiGroups", []) + r["resources"] + r["verbs"], r
        assert not r.get("resourceNames"), f"resourceNames would break list/watch: {r}"
        assert not r.get("nonResourceURLs"), r
        for g in r["apiGroups"]:
            for res in r["resources"]:
                for v in r["verbs"]:
                    out.add((g, res, v))
    return out


def _grants(objs: list[dict], sa: str, sa_ns: str):
    """(cluster-wide perms, {namespace: perms}) granted to the ServiceAccount by the render."""
    roles = {("ClusterRole", o["metadata"]["name"]): o for o in by_kind(objs, "ClusterRole")}
    roles |= {
        ("Role", o["metadata"]["name"], o["metadata"]["namespace"]): o
        for o in by_kind(objs, "Role")
    }

    def bound(binding: dict) -> bool:
        return any(
            s["kind"] == "ServiceAccount" and s["name"] == sa and s.get("namespace") == sa_ns
            for s in binding["subjects"]
        )

    cluster: set[Perm] = set()
    for b in by_kind(objs, "ClusterRoleBinding"):
        if bound(b):
            assert b["roleRef"]["kind"] == "ClusterRole"
            cluster |= _rules_to_perms(roles[("ClusterRole", b["roleRef"]["name"])]["rules"])
    per_ns: dict[str, set[Perm]] = {}
    for b in by_kind(objs, "RoleBinding"):
        if bound(b):
            ns = b["metadata"]["namespace"]
            ref = b["roleRef"]
            key = (
                ("ClusterRole", ref["name"])
                if ref["kind"] == "ClusterRole"
                else ("Role", ref["name"], ns)
            )
            per_ns.setdefault(ns, set()).update(_rules_to_perms(roles[key]["rules"]))
    return cluster, per_ns


def _sa_name(objs: list[dict]) -> str:
    (dep,) = by_kind(objs, "Deployment")
    return dep["spec"]["template"]["spec"]["serviceAccountName"]


def _cluster_role_perms(objs: list[dict]) -> set[Perm]:
    (role,) = by_kind(objs, "ClusterRole")
    return _rules_to_perms(role["rules"])


def test_cluster_wide_mode_binds_the_cluster_role_once():
    objs = objects(render())
    cluster, per_ns = _grants(objs, _sa_name(objs), NAMESPACE)
    assert per_ns == {}
    assert cluster == _cluster_role_perms(objs)
    assert not by_kind(objs, "Role") and not by_kind(objs, "RoleBinding")


def test_namespaced_mode_grants_the_same_only_in_the_watched_namespaces():
    objs = objects(render({"watchNamespaces": WATCHED}))
    cluster, per_ns = _grants(objs, _sa_name(objs), NAMESPACE)
    # nothing is granted outside the watched namespaces (no ClusterRoleBinding) ...
    assert cluster == set(), (
        f"granted in every namespace although watchNamespaces is set: {cluster}"
    )
    assert not by_kind(objs, "ClusterRoleBinding")
    # ... and each watched namespace gets the same permissions as cluster-wide mode
    assert sorted(per_ns) == sorted(WATCHED)
    for ns in WATCHED:
        assert per_ns[ns] == _cluster_role_perms(objects(render())), ns


def test_operator_holds_every_permission_it_grants_to_workers():
    """RBAC escalation prevention, checked on the Role the operator really builds."""
    builders = pytest.importorskip("npu_lora_operator.builders")
    body = {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": "run-1", "namespace": "team-a", "uid": "1234"},
        "spec": {"model": {"preset": "tiny-qwen3-moe"}, "data": {"path": "example:nsmc-mini"}},
    }
    role = builders.build_role(builders.Run.from_body(body))
    granted_to_worker = _rules_to_perms(
        [{k: v for k, v in r.items() if k != "resourceNames"} for r in role["rules"]]
    )
    assert ("npu-lora.io", "moefinetunes/status", "patch") in granted_to_worker
    objs = objects(render())
    cluster, _ = _grants(objs, _sa_name(objs), NAMESPACE)
    assert granted_to_worker <= cluster, granted_to_worker - cluster
    # the chart's comment names these explicitly
    for perm in [
        ("npu-lora.io", "moefinetunes", "get"),
        ("npu-lora.io", "moefinetunes/status", "get"),
        ("npu-lora.io", "moefinetunes/status", "patch"),
    ]:
        assert perm in cluster
