"""The chart's RBAC grants exactly what the operator's code needs.

The needed (apiGroup, resource, verb) set is derived from the operator's source by
``ship_rbac_scan`` (see its docstring): its kubernetes calls (typed client methods, and the
operator's own REST wrapper run on a recorder), its kopf handlers, kopf's fixed needs, and the
rules of the Role it grants to each worker (RBAC escalation prevention). No second hand-written
list exists: the chart is compared with that derivation, in both watch modes.
"""

from __future__ import annotations

import pytest
from chart_util import NAMESPACE, by_kind, objects, render

pytest.importorskip("helm_python")
pytest.importorskip("kopf")
pytest.importorskip("kubernetes")

import ship_rbac_scan as scan

WATCHED = ["team-a", "team-b"]


@pytest.fixture(scope="module")
def derivation() -> scan.Derivation:
    return scan.derive()


def _rules_to_perms(rules: list[dict]) -> set[scan.Perm]:
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

    cluster: set[scan.Perm] = set()
    for b in by_kind(objs, "ClusterRoleBinding"):
        if bound(b):
            assert b["roleRef"]["kind"] == "ClusterRole"
            cluster |= _rules_to_perms(roles[("ClusterRole", b["roleRef"]["name"])]["rules"])
    per_ns: dict[str, set[scan.Perm]] = {}
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


def _explain(perms: set[scan.Perm], d: scan.Derivation) -> str:
    return "\n".join(
        f"  {g or 'core'}/{r} {v}  <- {'; '.join(d.sources.get((g, r, v), ['?'])[:2])}"
        for g, r, v in sorted(perms)
    )


# ---------------------------------------------------------------------------------------------
# the derivation itself


def test_derivation_resolves_everything(derivation):
    assert derivation.unresolved == [], "\n".join(derivation.unresolved)
    assert derivation.modules, "no operator module found"


def test_no_call_escapes_the_scanner(derivation):
    """Calls named like the operator's REST-wrapper methods all go to a recognised wrapper."""
    assert derivation.unknown_receivers == [], "\n".join(derivation.unknown_receivers)


def test_derivation_scans_the_operator_entry_point(derivation):
    if not derivation.entry_found:
        pytest.xfail(
            f"{derivation.entry_module} (the `npu-lora operator` module) does not exist yet: "
            "the whole npu_lora_operator package minus sandbox/ was scanned"
        )
    assert derivation.entry_module in derivation.modules
    assert not any(".sandbox" in m for m in derivation.modules), derivation.modules


# ---------------------------------------------------------------------------------------------
# chart vs code


def test_cluster_wide_rbac_is_exactly_what_the_code_needs(derivation):
    objs = objects(render())
    cluster, per_ns = _grants(objs, _sa_name(objs), NAMESPACE)
    assert per_ns == {}
    need = derivation.needed(clusterwide=True)
    missing, extra = need - cluster, cluster - need
    assert not missing, "the chart's RBAC lacks permissions the operator uses:\n" + _explain(
        missing, derivation
    )
    if extra and not derivation.entry_found:
        pytest.xfail(f"operator entry point missing; chart grants unused {sorted(extra)}")
    assert not extra, f"the chart grants permissions no operator code uses: {sorted(extra)}"


def test_namespaced_rbac_is_exactly_what_the_code_needs(derivation):
    objs = objects(render({"watchNamespaces": WATCHED}))
    cluster, per_ns = _grants(objs, _sa_name(objs), NAMESPACE)
    need = derivation.needed(clusterwide=False)
    cluster_scoped = {p for p in need if scan.is_cluster_scoped(p[0], p[1])}
    namespaced = need - cluster_scoped
    # cluster-scoped needs can only come from a ClusterRoleBinding ...
    assert cluster_scoped <= cluster, _explain(cluster_scoped - cluster, derivation)
    # ... and nothing namespaced is granted outside the watched namespaces
    leaked = {p for p in cluster if not scan.is_cluster_scoped(p[0], p[1])}
    assert not leaked, f"granted in every namespace although watchNamespaces is set: {leaked}"
    assert sorted(per_ns) == sorted(WATCHED)
    for ns in WATCHED:
        missing = namespaced - per_ns[ns]
        assert not missing, f"namespace {ns} lacks:\n" + _explain(missing, derivation)
        extra = per_ns[ns] - namespaced
        if extra and not derivation.entry_found:
            pytest.xfail(f"operator entry point missing; chart grants unused {sorted(extra)}")
        assert not extra, f"namespace {ns}: granted but unused: {sorted(extra)}"
    extra_cluster = cluster - cluster_scoped
    assert not extra_cluster, extra_cluster


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


# ---------------------------------------------------------------------------------------------
# the scanner on known code (so a silent scanner cannot pass the tests above)

FAKE_OPERATOR = """
import asyncio
import kopf
import kubernetes
from kubernetes import client, watch
from npu_lora.api.v1alpha1 import GROUP, PLURAL, VERSION

batch = client.BatchV1Api()
events_api: client.EventsV1Api = client.EventsV1Api()
STATUS = f"{PLURAL}/status"


@kopf.on.create(GROUP, VERSION, PLURAL)
def created(body, **_):
    batch.create_namespaced_job("ns", {})
    core = kubernetes.client.CoreV1Api()
    core.read_namespaced_config_map("x", "ns")
    client.CustomObjectsApi().patch_namespaced_custom_object_status(
        GROUP, VERSION, "ns", PLURAL, "x", {})
    events_api.create_namespaced_event("ns", {})
    for ev in watch.Watch().stream(core.list_namespaced_pod, "ns"):
        pass


@kopf.on.event("batch", "v1", "jobs")
def job_event(**_):
    pass


@kopf.on.event("pods")
def pod_event(**_):
    pass


async def later():
    await asyncio.to_thread(batch.patch_namespaced_job, "j", "ns", {})


RULE = {"apiGroups": [GROUP], "resources": [STATUS], "verbs": ["get", "patch"]}
"""


def test_scanner_maps_client_calls_kopf_handlers_and_granted_rules(tmp_path):
    d = scan.derive_source(FAKE_OPERATOR, tmp_path / "fake_operator.py")
    assert d.unresolved == []
    assert d.needed(clusterwide=True) == {
        # typed client calls, named by the client's own paths
        ("batch", "jobs", "create"),
        ("batch", "jobs", "patch"),  # passed to asyncio.to_thread
        ("", "configmaps", "get"),
        ("npu-lora.io", "moefinetunes/status", "patch"),
        ("events.k8s.io", "events", "create"),  # EventsV1Api, not core
        ("", "pods", "list"),
        ("", "pods", "watch"),  # Watch().stream
        # kopf handlers
        ("npu-lora.io", "moefinetunes", "list"),
        ("npu-lora.io", "moefinetunes", "watch"),
        ("npu-lora.io", "moefinetunes", "patch"),
        ("batch", "jobs", "list"),
        ("batch", "jobs", "watch"),
        # a Role rule it grants
        ("npu-lora.io", "moefinetunes/status", "get"),
        # kopf itself
        ("", "events", "create"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    }
    assert d.needed(clusterwide=False) - d.needed(clusterwide=True) == {
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
    }


def test_scanner_flags_wrapper_calls_on_unknown_receivers(tmp_path):
    src = """
class Raw:
    def request(self, method, p, body=None):
        return self.api.call_api(method, p)

    def merge_patch(self, p):
        return self.request("PATCH", p)


def handler(thing):
    thing.merge_patch("/api/v1/namespaces/ns/pods/x")
"""
    d = scan.derive_source(src, tmp_path / "fake_receiver_operator.py")
    assert len(d.unknown_receivers) == 1 and "thing.merge_patch" in d.unknown_receivers[0]


def test_scanner_reports_what_it_cannot_resolve(tmp_path):
    src = """
from kubernetes import client
def f(group):
    client.CustomObjectsApi().list_namespaced_custom_object(group, "v1", "ns", "things")
"""
    d = scan.derive_source(src, tmp_path / "fake_unresolved_operator.py")
    assert len(d.unresolved) == 1 and "list_namespaced_custom_object" in d.unresolved[0]


def test_scanner_honours_disabled_kopf_scanning(tmp_path):
    src = """
import kopf
def settings(s):
    s.scanning.disabled = True
"""
    d = scan.derive_source(src, tmp_path / "fake_noscan_operator.py")
    assert d.needed(clusterwide=False) == {("", "events", "create")}


def test_scanner_runs_rest_wrapper_methods_on_a_recorder(tmp_path):
    """A wrapper class (calls ``call_api``) is resolved by running its real methods."""
    src = """
import json

def path(api_version, plural, namespace, name=None, sub=None):
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    p = f"{base}/namespaces/{namespace}/{plural}"
    if name:
        p += f"/{name}"
    return f"{p}/{sub}" if sub else p


class Raw:
    def request(self, method, p, body=None):
        return self.api.call_api(method, p)

    def get(self, api_version, plural, name, namespace):
        return self.request("GET", path(api_version, plural, namespace, name))

    def create(self, obj):
        kinds = {"Job": "jobs", "ConfigMap": "configmaps"}
        ns = obj["metadata"]["namespace"]
        return self.request("POST", path(obj["apiVersion"], kinds[obj["kind"]], ns))

    def patch(self, api_version, plural, name, namespace, body, sub=None):
        return self.request("PATCH", path(api_version, plural, namespace, name, sub))


def build_job():
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {}}


def children():
    out = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}]
    out.append(build_job())
    return out


def ensure(kube: Raw, obj):
    kube.create(obj)


def handler(name, namespace):
    kube = Raw()
    for child in children():
        ensure(kube, child)
    kube.get("batch/v1", "jobs", name, namespace)
    kube.patch("npu-lora.io/v1alpha1", "moefinetunes", name, namespace, {}, sub="status")
"""
    d = scan.derive_source(src, tmp_path / "fake_wrapper_operator.py")
    assert d.unresolved == []
    assert d.needed(clusterwide=True) == {
        ("", "configmaps", "create"),  # via children() -> for loop -> ensure(kube, child)
        ("batch", "jobs", "create"),
        ("batch", "jobs", "get"),
        ("npu-lora.io", "moefinetunes/status", "patch"),
    }
