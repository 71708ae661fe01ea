"""The chart's RBAC against the operator's real API calls.

The operator runs as the chart's ServiceAccount, bound to the chart's ClusterRole exactly as the
chart binds it (the render's RBAC objects are created in the emulator, which enforces RBAC on that
identity and records every decision, see ``ApiEmulator.authorization_log``). One run goes through
creation (two workers: an Indexed Job and a headless Service), spec changes while suspended, an
operator restart (children re-created: 409, then get), resumption and success. Then:

(a) no request of the operator's identity was denied (the chart grants too little otherwise);
(b) every permission of the chart's ClusterRole was used, or is listed in ``NOT_EXERCISED`` with
    the reason the operator still needs it (the chart grants too much otherwise).

The chart is rendered with ``watchNamespaces: [default]`` (a RoleBinding in ``default`` only), so a
cluster-scoped request would be denied as well. tests/ship/test_ship_rbac.py checks the chart's
structure in both watch modes and that the operator holds what it grants to workers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from e2e_harness import ROOT, Cluster, OperatorProcess, manifest
from testkit import free_port

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="the worker needs torch (npu-lora[worker])",
    ),
]
pytest.importorskip("helm_python")

_spec = importlib.util.spec_from_file_location("_chart_util_e2e", ROOT / "tests/ship/chart_util.py")
assert _spec is not None and _spec.loader is not None
chart_util = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chart_util)

Perm = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

ADOPT = (
    "ensure_object adopts an orphaned child of the same name (e.g. left by "
    "`kubectl delete --cascade=orphan`) with a merge patch of its ownerReferences"
)
#: permissions of the chart's ClusterRole that the scenario does not use, and why they stay
NOT_EXERCISED: dict[Perm, str] = {
    ("npu-lora.io", "moefinetunes/status", "get"): (
        "granted to each run's worker Role; RBAC escalation prevention: one can only grant what "
        "one holds"
    ),
    ("", "serviceaccounts", "patch"): ADOPT,
    ("rbac.authorization.k8s.io", "roles", "patch"): ADOPT,
    ("rbac.authorization.k8s.io", "rolebindings", "patch"): ADOPT,
    ("", "services", "patch"): ADOPT,
}


def _perms(rules: list[dict[str, Any]]) -> set[Perm]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def _install_chart_rbac(cluster: Cluster) -> tuple[str, set[Perm]]:
    """Create the render's ServiceAccount and RBAC objects; returns (user, ClusterRole perms)."""
    objs = chart_util.objects(chart_util.render({"watchNamespaces": ["default"]}))
    emu = cluster.emulator
    emu.create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": chart_util.NAMESPACE}}
    )
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    for obj in objs:
        if obj["kind"] in kinds:
            emu.create(obj)
    (role,) = chart_util.by_kind(objs, "ClusterRole")
    (sa,) = chart_util.by_kind(objs, "ServiceAccount")
    ns = sa["metadata"].get("namespace") or chart_util.NAMESPACE
    return f"system:serviceaccount:{ns}:{sa['metadata']['name']}", _perms(role["rules"])


def _used(cluster: Cluster, user: str) -> set[Perm]:
    return {d.permission for d in cluster.emulator.authorization_log() if d.user == user}


def test_operator_under_the_charts_rbac(cluster: Cluster, tmp_path: Path) -> None:
    user, granted = _install_chart_rbac(cluster)
    ns, sa = user.split(":")[2:]
    kubeconfig = cluster.emulator.write_kubeconfig(
        tmp_path / "operator-kubeconfig", service_account=(ns, sa)
    )
    op = OperatorProcess(kubeconfig, tmp_path).start()

    wait = op.wait
    name = "e2e-rbac"
    try:
        # two workers: the Indexed Job and its headless Service go through the chart's RBAC too
        dp = {"workers": 2, "port": free_port(), "rendezvousTimeoutSeconds": 120}
        cluster.apply(manifest(name, steps=4, suspend=True, distributed=dp))
        wait(lambda: cluster.status(name).get("phase") == "Suspended", 60, "phase Suspended")
        patch = '{"spec":{"activeDeadlineSeconds":3600,"reporting":{"everySteps":2}}}'
        cluster.kubectl("patch", "mft", name, "--type", "merge", "-p", patch)
        wait(
            lambda: cluster.jobs(name)[0]["spec"].get("activeDeadlineSeconds") == 3600,
            30,
            "the Job patched",
        )
        wait(lambda: ("", "configmaps", "patch") in _used(cluster, user), 30, "the config patch")
        # a restart re-runs the creation handler: every child answers 409, then is read
        op.kill()
        op.start()
        wait(lambda: ("batch", "jobs", "get") in _used(cluster, user), 60, "the children read")
        cluster.kubectl("patch", "mft", name, "--type", "merge", "-p", '{"spec":{"suspend":false}}')
        wait(
            lambda: cluster.status(name).get("phase") in ("Succeeded", "Failed"),
            240,
            "the end of the run",
        )
        assert cluster.status(name)["phase"] == "Succeeded", cluster.status(name)
    finally:
        op.stop()

    log = cluster.emulator.authorization_log()
    denied = sorted({(d.permission, d.namespace) for d in log if not d.allowed})
    assert not denied, f"requests denied under the chart's RBAC: {denied}\n{op.log()}"
    used = _used(cluster, user)
    assert used, "the operator's requests were not authorized as its ServiceAccount"
    assert used <= granted, used - granted  # implied by (a); names what is missing
    unexercised = granted - used
    unexplained = unexercised - set(NOT_EXERCISED)
    assert not unexplained, (
        "the chart's ClusterRole grants permissions the operator did not use; remove them or "
        f"list them in NOT_EXERCISED with the reason: {sorted(unexplained)}"
    )
    stale = set(NOT_EXERCISED) - granted
    assert not stale, f"NOT_EXERCISED names permissions the chart does not grant: {sorted(stale)}"
