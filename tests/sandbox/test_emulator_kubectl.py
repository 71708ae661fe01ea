"""The real kubectl (v1.32) against the API emulator."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from npu_lora_sandbox.emulator import ApiEmulator

CM = """apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  labels: {app: demo}
data:
  a: "1"
"""

WIDGET = """apiVersion: example.com/v1
kind: Widget
metadata:
  name: w1
spec:
  size: 3
  color: blue
"""


@pytest.fixture
def crd(emulator: ApiEmulator, make_crd: Any) -> None:
    emulator.load_crd(make_crd())


def test_apply_twice_get_delete_configmap(kubectl: Any, emulator: ApiEmulator) -> None:
    assert "configmap/settings created" in kubectl("apply", "-f", "-", input=CM).stdout
    assert "configmap/settings unchanged" in kubectl("apply", "-f", "-", input=CM).stdout
    out = kubectl("apply", "-f", "-", input=CM.replace('a: "1"', 'a: "2"\n  b: "3"')).stdout
    assert "configmap/settings configured" in out
    assert emulator.get("v1", "ConfigMap", "settings", "default")["data"] == {"a": "2", "b": "3"}
    # Client-side apply removes what the last applied configuration had and the new one lacks.
    kubectl("apply", "-f", "-", input=CM)
    assert emulator.get("v1", "ConfigMap", "settings", "default")["data"] == {"a": "1"}
    table = kubectl("get", "configmaps").stdout.splitlines()
    assert table[0].split() == ["NAME", "DATA", "AGE"] and table[1].split()[:2] == ["settings", "1"]
    obj = json.loads(kubectl("get", "cm", "settings", "-o", "json").stdout)
    assert obj["kind"] == "ConfigMap" and obj["metadata"]["labels"] == {"app": "demo"}
    assert "settings" in kubectl("get", "cm", "-l", "app=demo", "-o", "name").stdout
    assert 'configmap "settings" deleted' in kubectl("delete", "cm", "settings").stdout
    res = kubectl("get", "cm", "settings", check=False)
    assert res.returncode == 1 and 'configmaps "settings" not found' in res.stderr


def test_custom_resource_apply_table_and_status(
    kubectl: Any, emulator: ApiEmulator, crd: None
) -> None:
    assert "widget.example.com/w1 created" in kubectl("apply", "-f", "-", input=WIDGET).stdout
    assert "widget.example.com/w1 unchanged" in kubectl("apply", "-f", "-", input=WIDGET).stdout
    assert "configured" in kubectl("apply", "-f", "-", input=WIDGET.replace("blue", "green")).stdout
    kubectl(
        "patch",
        "widget",
        "w1",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"phase":"Running","conditions":[{"type":"Other","status":"False"},{"type":"Ready","status":"True"}]}}',
    )
    lines = kubectl("get", "wd").stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "COLOR", "READY", "AGE"]
    assert lines[1].split()[:4] == ["w1", "3", "green", "True"]
    wide = kubectl("get", "widgets", "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "SIZE", "COLOR", "READY", "PHASE", "AGE"]
    assert "Running" in wide[1]
    y = kubectl("get", "widget", "w1", "-o", "yaml").stdout
    assert "phase: Running" in y and "maxSize: 10" in y
    assert "widget.example.com/w1" in kubectl("get", "examples", "-o", "name").stdout  # category
    assert "widgets" in kubectl("api-resources").stdout
    # Validation errors print like the apiserver's.
    bad = kubectl(
        "apply",
        "-f",
        "-",
        input=WIDGET.replace("size: 3", "size: 0").replace("w1", "w2"),
        check=False,
    )
    assert bad.returncode == 1
    assert (
        'The Widget "w2" is invalid: spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1'
        in bad.stderr
    )
    bad = kubectl(
        "apply", "-f", "-", input=WIDGET.replace("color: blue", "colour: blue"), check=False
    )
    assert bad.returncode == 1 and 'unknown field "spec.colour"' in bad.stderr
    desc = kubectl("describe", "widget", "w1").stdout
    assert "Name:         w1" in desc and "Phase:" in desc
    # Server-side apply.
    ssa = kubectl("apply", "--server-side", "-f", "-", input=WIDGET.replace("w1", "w3")).stdout
    assert "widget.example.com/w3 serverside-applied" in ssa
    kubectl(
        "apply", "--server-side", "-f", "-", input=WIDGET.replace("w1", "w3").replace("blue", "red")
    )
    assert emulator.get("example.com/v1", "Widget", "w3", "default")["spec"]["color"] == "red"
    kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        input=WIDGET.replace("w1", "w3").replace("blue", "green"),
    )
    no_color = WIDGET.replace("w1", "w3").replace("  color: blue\n", "")
    kubectl("apply", "--server-side", "-f", "-", input=no_color)
    # dropped from the applied configuration: removed, then defaulted by the schema
    assert emulator.get("example.com/v1", "Widget", "w3", "default")["spec"]["color"] == "red"
    assert "deleted" in kubectl("delete", "-f", "-", input=WIDGET).stdout
    assert emulator.get("example.com/v1", "Widget", "w1", "default") is None


def test_crd_via_kubectl_apply_and_wait(kubectl: Any, emulator: ApiEmulator, make_crd: Any) -> None:
    kubectl("apply", "-f", "-", input=json.dumps(make_crd()))
    kubectl("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=10s")
    kubectl("apply", "-f", "-", input=WIDGET)

    def later() -> None:
        time.sleep(0.5)
        emulator.patch(
            "example.com/v1",
            "Widget",
            "w1",
            {"status": {"phase": "Done"}},
            namespace="default",
            subresource="status",
        )

    threading.Thread(target=later).start()
    out = kubectl(
        "wait", "--for=jsonpath={.status.phase}=Done", "widget/w1", "--timeout=10s"
    ).stdout
    assert "condition met" in out


def test_get_watch_receives_update(kubectl: Any, emulator: ApiEmulator, crd: None) -> None:
    kubectl("apply", "-f", "-", input=WIDGET)
    proc = kubectl.popen("get", "widgets", "-w")
    try:
        time.sleep(1.0)
        emulator.patch(
            "example.com/v1",
            "Widget",
            "w1",
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            namespace="default",
            subresource="status",
        )
        time.sleep(1.0)
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    lines = [line.split() for line in out.splitlines()]
    assert lines[0][:2] == ["NAME", "SIZE"], (out, err)
    assert lines[1][:3] == ["w1", "3", "blue"]
    assert lines[-1][:4] == ["w1", "3", "blue", "True"], (out, err)


def test_replace_conflict_and_patch_types(kubectl: Any, emulator: ApiEmulator) -> None:
    kubectl("apply", "-f", "-", input=CM)
    current = json.loads(kubectl("get", "cm", "settings", "-o", "json").stdout)
    emulator.patch("v1", "ConfigMap", "settings", {"data": {"x": "y"}}, namespace="default")
    res = kubectl("replace", "-f", "-", input=json.dumps(current), check=False)
    assert res.returncode == 1 and "the object has been modified" in res.stderr
    kubectl(
        "patch",
        "cm",
        "settings",
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/data/a","value":"9"}]',
    )
    kubectl("patch", "cm", "settings", "-p", '{"data":{"c":"d"}}')  # strategic merge
    assert emulator.get("v1", "ConfigMap", "settings", "default")["data"] == {
        "a": "9",
        "x": "y",
        "c": "d",
    }
    kubectl("label", "cm", "settings", "extra=1")
    kubectl("annotate", "cm", "settings", "note=hi")
    meta = emulator.get("v1", "ConfigMap", "settings", "default")["metadata"]
    assert meta["labels"]["extra"] == "1" and meta["annotations"]["note"] == "hi"


def test_namespaces_and_builtin_tables(kubectl: Any, emulator: ApiEmulator) -> None:
    kubectl("create", "namespace", "team")  # typed client: a protobuf body
    kubectl("create", "configmap", "lit", "-n", "team", "--from-literal=k=v")
    kubectl("create", "secret", "generic", "sec", "-n", "team", "--from-literal=p=w")
    kubectl("create", "serviceaccount", "runner", "-n", "team")
    assert emulator.get("v1", "ConfigMap", "lit", "team")["data"] == {"k": "v"}
    assert emulator.get("v1", "Secret", "sec", "team")["data"] == {"p": "dw=="}
    assert emulator.get("v1", "ServiceAccount", "runner", "team") is not None
    kubectl("apply", "-n", "team", "-f", "-", input=CM)
    out = kubectl("get", "cm", "-A").stdout
    assert "team" in out and "settings" in out
    assert "team" in kubectl("get", "ns").stdout
    kubectl("delete", "ns", "team")
    assert emulator.get("v1", "ConfigMap", "settings", "team") is None


RBAC = """apiVersion: v1
kind: ServiceAccount
metadata: {name: run-sa}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: run-role}
rules:
- apiGroups: [example.com]
  resources: [widgets/status]
  verbs: [get, patch]
  resourceNames: [w1]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: run-binding}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: run-role}
subjects:
- {kind: ServiceAccount, name: run-sa, namespace: default}
"""


def test_rbac_can_i(kubectl: Any, crd: None) -> None:
    kubectl("apply", "-f", "-", input=RBAC)
    sa = "--as=system:serviceaccount:default:run-sa"

    def can(*args: str) -> str:
        return kubectl("auth", "can-i", *args, sa, check=False).stdout.strip()

    assert can("patch", "widgets.example.com/w1", "--subresource=status") == "yes"
    assert can("patch", "widgets.example.com/w2", "--subresource=status") == "no"
    assert can("patch", "widgets.example.com/w1") == "no"
    assert can("get", "widgets.example.com/w1", "--subresource=status", "-n", "other") == "no"
    assert can("delete", "pods") == "no"
    assert kubectl("auth", "can-i", "delete", "pods").stdout.strip() == "yes"  # the sandbox admin


def test_rbac_enforced_for_impersonation(kubectl: Any, emulator: ApiEmulator, crd: None) -> None:
    kubectl("apply", "-f", "-", input=RBAC)
    kubectl("apply", "-f", "-", input=WIDGET)
    sa = "--as=system:serviceaccount:default:run-sa"
    res = kubectl("get", "pods", sa, check=False)
    assert res.returncode == 1
    assert (
        'pods is forbidden: User "system:serviceaccount:default:run-sa" cannot list resource '
        '"pods" in API group "" in the namespace "default"'
    ) in res.stderr
    kubectl(
        "patch",
        "widget",
        "w1",
        sa,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"phase":"X"}}',
    )
    assert emulator.get("example.com/v1", "Widget", "w1", "default")["status"] == {"phase": "X"}
    res = kubectl(
        "patch", "widget", "w1", sa, "--type=merge", "-p", '{"spec":{"size":4}}', check=False
    )
    assert res.returncode == 1 and "forbidden" in res.stderr
