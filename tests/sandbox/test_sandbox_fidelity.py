"""The sandbox answers like an API server where our tests rely on it (issue 38), through real
HTTP (kubectl, the kubernetes client): RBAC escalation prevention, server-side apply conflicts,
400 for malformed selectors and watch parameters, 422 for patches of immutable metadata, and
duplicate keys in YAML bodies handled as in JSON bodies."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from npu_lora_sandbox.emulator import ApiEmulator

RBAC = "rbac.authorization.k8s.io/v1"
CM = "/api/v1/namespaces/default/configmaps"


def _create(emu: ApiEmulator, obj: dict[str, Any]) -> dict[str, Any]:
    return emu.create(obj)


def _role(name: str, rules: list[dict[str, Any]], kind: str = "Role") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if kind == "Role":
        meta["namespace"] = "default"
    return {"apiVersion": RBAC, "kind": kind, "metadata": meta, "rules": rules}


def _binding(name: str, role_kind: str, role: str, sa: str = "dev") -> dict[str, Any]:
    return {
        "apiVersion": RBAC,
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "default"}],
    }


@pytest.fixture
def dev(emulator: ApiEmulator, kubectl: Any) -> Any:
    """kubectl as ServiceAccount ``default/dev``, who may write Roles and RoleBindings of the
    namespace and read ConfigMaps, nothing more."""
    _create(
        emulator,
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "dev", "namespace": "default"},
        },
    )
    rules = [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["roles", "rolebindings"],
            "verbs": ["get", "list", "create", "update", "patch"],
        },
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
    ]
    _create(emulator, _role("dev-rbac", rules))
    _create(emulator, _binding("dev-rbac", "Role", "dev-rbac"))
    _create(
        emulator,
        _role("power", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}], "ClusterRole"),
    )
    token = emulator.service_account_token("default", "dev")

    def as_dev(*args: str, input: str | None = None) -> Any:
        return kubectl(f"--token={token}", *args, input=input, check=False)

    return as_dev


def _forbidden_escalation(r: Any) -> None:
    assert r.returncode != 0, r.stdout
    assert "forbidden" in r.stderr.lower(), r.stderr
    assert "attempting to grant RBAC permissions not currently held" in r.stderr, r.stderr


def test_a_role_with_rules_not_held_is_refused(emulator: ApiEmulator, dev: Any) -> None:
    steal = _role("steal", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}])
    _forbidden_escalation(dev("apply", "-f", "-", input=yaml.safe_dump(steal)))
    assert emulator.get(RBAC, "Role", "steal", namespace="default") is None
    # wildcards are held only as wildcards
    star = _role("star", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}])
    _forbidden_escalation(dev("create", "-f", "-", input=yaml.safe_dump(star)))
    # what the user holds may be granted (also narrowed to names)
    ok = _role(
        "cm-reader",
        [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": ["get"],
                "resourceNames": ["a"],
            }
        ],
    )
    r = dev("create", "-f", "-", input=yaml.safe_dump(ok))
    assert r.returncode == 0, r.stderr
    # a patch that adds a rule not held is refused and changes nothing
    patch = {"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]}
    _forbidden_escalation(
        dev("patch", "role", "cm-reader", "--type=merge", "-p", json.dumps(patch))
    )
    stored = emulator.get(RBAC, "Role", "cm-reader", namespace="default")
    assert stored["rules"][0]["resources"] == ["configmaps"]


def test_escalate_verb_allows_rules_not_held(emulator: ApiEmulator, dev: Any) -> None:
    esc = [
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}
    ]
    _create(emulator, _role("dev-escalate", esc))
    _create(emulator, _binding("dev-escalate", "Role", "dev-escalate"))
    steal = _role("steal", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}])
    r = dev("apply", "-f", "-", input=yaml.safe_dump(steal))
    assert r.returncode == 0, r.stderr


def test_binding_a_role_not_held_needs_bind(emulator: ApiEmulator, dev: Any) -> None:
    grab = _binding("grab", "ClusterRole", "power")
    _forbidden_escalation(dev("apply", "-f", "-", input=yaml.safe_dump(grab)))
    assert emulator.get(RBAC, "RoleBinding", "grab", namespace="default") is None
    # a role whose rules the user holds may be bound
    _create(
        emulator,
        _role("cm-get", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
    )
    r = dev("apply", "-f", "-", input=yaml.safe_dump(_binding("mine", "Role", "cm-get", "other")))
    assert r.returncode == 0, r.stderr
    # a binding to a role that does not exist: refused without bind
    r = dev("apply", "-f", "-", input=yaml.safe_dump(_binding("ghost", "Role", "ghost")))
    assert r.returncode != 0 and "forbidden" in r.stderr.lower()
    # `bind` on exactly that ClusterRole allows it
    bind = [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "verbs": ["bind"],
            "resourceNames": ["power"],
        }
    ]
    _create(emulator, _role("dev-bind", bind))
    _create(emulator, _binding("dev-bind", "Role", "dev-bind"))
    r = dev("apply", "-f", "-", input=yaml.safe_dump(grab))
    assert r.returncode == 0, r.stderr
    # a binding's roleRef never changes (422), for anyone
    patch = {"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-get"}}
    r = dev("patch", "rolebinding", "grab", "--type=merge", "-p", json.dumps(patch))
    assert r.returncode != 0 and "roleRef" in r.stderr, r.stderr
    assert (
        emulator.get(RBAC, "RoleBinding", "grab", namespace="default")["roleRef"]["name"] == "power"
    )


# --- server-side apply ------------------------------------------------------------------------


def _ssa(kubectl: Any, manager: str, value: str, *extra: str) -> Any:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "shared", "namespace": "default"},
        "data": {"key": value},
    }
    return kubectl(
        "apply",
        "--server-side",
        f"--field-manager={manager}",
        *extra,
        "-f",
        "-",
        input=yaml.safe_dump(cm),
        check=False,
    )


def test_server_side_apply_by_a_second_manager_conflicts_unless_forced(
    emulator: ApiEmulator, kubectl: Any
) -> None:
    assert _ssa(kubectl, "alice", "1").returncode == 0
    assert _ssa(kubectl, "bob", "1").returncode == 0  # the same value: shared, no conflict
    r = _ssa(kubectl, "bob", "2")
    assert r.returncode != 0
    assert "conflict" in r.stderr.lower() and "alice" in r.stderr and ".data.key" in r.stderr
    assert emulator.get("v1", "ConfigMap", "shared", namespace="default")["data"] == {"key": "1"}
    r = _ssa(kubectl, "bob", "2", "--force-conflicts")
    assert r.returncode == 0, r.stderr
    assert emulator.get("v1", "ConfigMap", "shared", namespace="default")["data"] == {"key": "2"}
    # the field is bob's now: alice conflicts
    r = _ssa(kubectl, "alice", "3")
    assert r.returncode != 0 and "bob" in r.stderr


# --- selectors and watch parameters -------------------------------------------------------------


def _raw(emu: ApiEmulator, path: str, query: list[tuple[str, str]]) -> int:
    """GET with the admin token; the status code (a watch is read up to its first bytes)."""
    url = emu.url + path + "?" + urllib.parse.urlencode(query)
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {emu.admin_token}"})
    try:
        with urllib.request.urlopen(req, timeout=10, context=emu.tls.client_context()) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


BAD_QUERIES = [
    [("labelSelector", "a in (b")],
    [("labelSelector", "a=b=c")],
    [("labelSelector", "=x")],
    [("labelSelector", "a in ()")],
    [("labelSelector", "!!a")],
    [("labelSelector", "a b")],
    [("labelSelector", "x/y/z=1")],
    [("labelSelector", "a,,b")],
    [("labelSelector", "a=" + "v" * 64)],
    [("labelSelector", "a notin (b,(c))")],
    [("fieldSelector", "metadata.name")],
    [("fieldSelector", "=x")],
    [("fieldSelector", "metadata.name=a=b")],
    [("fieldSelector", "metadata.name=a\\q")],
    [("timeoutSeconds", "abc"), ("watch", "true")],
    [("timeoutSeconds", "1.5"), ("watch", "true")],
    [("resourceVersion", "abc"), ("watch", "true")],
    [("resourceVersion", "-1")],
    [("limit", "-1")],
    [("limit", "many")],
    [("resourceVersionMatch", "Newest"), ("resourceVersion", "1")],
]
GOOD_QUERIES = [
    [("labelSelector", "a in (b, c),!d,e,f!=g,npu-lora.io/run=x,h==")],
    [("labelSelector", "a notin (b)")],
    [("fieldSelector", "metadata.name=x,metadata.namespace!=kube-system")],
    [("fieldSelector", "metadata.name=a\\,b")],
    [("timeoutSeconds", "1"), ("watch", "true")],
    [("resourceVersion", "0"), ("limit", "5")],
]


@pytest.mark.parametrize(
    ("path", "selector", "code"),
    [
        (CM, "data.a=1", 400),
        (CM, "spec.x=1", 400),
        (CM, "metadata.name=a,metadata.namespace=default", 200),
        ("/api/v1/namespaces/default/secrets", "type=Opaque", 200),
        ("/api/v1/namespaces/default/secrets", "data.token=x", 400),
        ("/api/v1/namespaces/default/events", "involvedObject.name=w,type=Warning", 200),
        ("/api/v1/namespaces/default/pods", "spec.nodeName=n,status.phase!=Failed", 200),
        ("/api/v1/namespaces/default/pods", "spec.containers=x", 400),
        ("/apis/batch/v1/namespaces/default/jobs", "status.successful=1", 200),
    ],
)
def test_field_selectors_name_fields_the_resource_can_select_on(
    emulator: ApiEmulator, path: str, selector: str, code: int
) -> None:
    assert _raw(emulator, path, [("fieldSelector", selector)]) == code
    assert (
        _raw(emulator, path, [("fieldSelector", selector), ("watch", "1"), ("timeoutSeconds", "1")])
        == code
    )


@pytest.mark.parametrize("query", BAD_QUERIES, ids=[str(q) for q in BAD_QUERIES])
def test_malformed_selectors_and_watch_parameters_are_400(
    emulator: ApiEmulator, query: list
) -> None:
    assert _raw(emulator, CM, query) == 400


@pytest.mark.parametrize("query", GOOD_QUERIES, ids=[str(q) for q in GOOD_QUERIES])
def test_well_formed_selectors_and_watch_parameters_are_answered(
    emulator: ApiEmulator, query: list
) -> None:
    assert _raw(emulator, CM, query) == 200


def test_a_bad_selector_through_the_client_and_kubectl_is_a_400(
    api_client: Any, kubectl: Any
) -> None:
    core = k8s.CoreV1Api(api_client)
    with pytest.raises(ApiException) as e:
        core.list_namespaced_config_map("default", label_selector="a in (b")
    assert e.value.status == 400
    r = kubectl("get", "configmaps", "--field-selector", "=x", check=False)
    assert r.returncode != 0
    assert "BadRequest" in r.stderr or "unable to parse" in r.stderr, r.stderr


# --- immutable metadata -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch_type", "patch", "field"),
    [
        ("json", [{"op": "replace", "path": "/metadata/uid", "value": "x"}], "metadata.uid"),
        ("json", [{"op": "replace", "path": "/kind", "value": "Secret"}], "kind"),
        ("json", [{"op": "replace", "path": "/apiVersion", "value": "v2"}], "apiVersion"),
        ("json", [{"op": "replace", "path": "/metadata/name", "value": "y"}], "metadata.name"),
        (
            "json",
            [{"op": "replace", "path": "/metadata/namespace", "value": "kube-system"}],
            "metadata.namespace",
        ),
        ("merge", {"metadata": {"uid": "x"}}, "metadata.uid"),
        ("merge", {"kind": "Secret"}, "kind"),
        ("merge", {"metadata": {"name": "y"}}, "metadata.name"),
        ("merge", {"metadata": {"namespace": "other"}}, "metadata.namespace"),
    ],
)
def test_patches_of_immutable_metadata_are_422(
    emulator: ApiEmulator, kubectl: Any, patch_type: str, patch: Any, field: str
) -> None:
    cm = _create(
        emulator,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "im", "namespace": "default"},
        },
    )
    r = kubectl(
        "patch", "configmap", "im", f"--type={patch_type}", "-p", json.dumps(patch), check=False
    )
    assert r.returncode != 0, r.stdout
    assert "is invalid" in r.stderr and field in r.stderr, r.stderr
    after = emulator.get("v1", "ConfigMap", "im", namespace="default")
    assert after["metadata"]["uid"] == cm["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] == cm["metadata"]["resourceVersion"]


def test_immutable_metadata_patch_status_code_through_the_client(
    emulator: ApiEmulator, api_client: Any
) -> None:
    _create(
        emulator,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "im", "namespace": "default"},
        },
    )
    core = k8s.CoreV1Api(api_client)
    with pytest.raises(ApiException) as e:
        core.patch_namespaced_config_map(
            "im", "default", [{"op": "replace", "path": "/metadata/uid", "value": "x"}]
        )
    assert e.value.status == 422
    # what may change still does; a uid left out keeps the stored one
    core.patch_namespaced_config_map("im", "default", {"metadata": {"labels": {"a": "b"}}})
    uid = emulator.get("v1", "ConfigMap", "im", namespace="default")["metadata"]["uid"]
    core.patch_namespaced_config_map("im", "default", [{"op": "remove", "path": "/metadata/uid"}])
    assert emulator.get("v1", "ConfigMap", "im", namespace="default")["metadata"]["uid"] == uid


# --- duplicate keys in YAML bodies --------------------------------------------------------------


def _post(
    emu: ApiEmulator, path: str, body: str, ctype: str, method: str = "POST"
) -> tuple[int, Any, dict]:
    req = urllib.request.Request(
        emu.url + path,
        data=body.encode(),
        method=method,
        headers={"Authorization": f"Bearer {emu.admin_token}", "Content-Type": ctype},
    )
    try:
        with urllib.request.urlopen(req, timeout=10, context=emu.tls.client_context()) as r:
            return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


DUP_YAML = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: '1'\n  a: '2'\n"


def test_duplicate_yaml_keys_are_handled_as_for_json(emulator: ApiEmulator) -> None:
    code, out, _ = _post(
        emulator, CM + "?fieldValidation=Strict", DUP_YAML.format(name="d1"), "application/yaml"
    )
    assert code == 400 and "duplicate" in out["message"]
    assert emulator.get("v1", "ConfigMap", "d1", namespace="default") is None
    # Warn (the default): created with a warning, as a JSON body is
    code, _, headers = _post(emulator, CM, DUP_YAML.format(name="d2"), "application/yaml")
    assert code == 201 and "duplicate" in headers.get("Warning", "")
    # a server-side apply's YAML never takes a duplicate key
    code, out, _ = _post(
        emulator,
        CM + "/d3?fieldManager=m",
        DUP_YAML.format(name="d3"),
        "application/apply-patch+yaml",
        method="PATCH",
    )
    assert code == 400 and "duplicate" in out["message"]
    assert emulator.get("v1", "ConfigMap", "d3", namespace="default") is None
