"""The API emulator through the real ``kubernetes`` client and raw HTTP."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from npu_lora_sandbox.emulator import ApiEmulator, ApiError


def http(
    emu: ApiEmulator,
    method: str,
    path: str,
    body: Any = None,
    ctype: str = "application/json",
    accept: str = "application/json",
) -> tuple[int, Any]:
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    headers = {"Content-Type": ctype, "Accept": accept}
    headers["Authorization"] = f"Bearer {emu.admin_token}"
    req = urllib.request.Request(emu.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10, context=emu.tls.client_context()) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}


def test_create_sets_server_fields_and_201(api_client: Any, emulator: ApiEmulator) -> None:
    v1 = client.CoreV1Api(api_client)
    obj = v1.create_namespaced_config_map("default", cm("a"))
    assert obj is not None  # the client maps only 201 to a body
    assert obj.metadata.uid and obj.metadata.creation_timestamp
    assert obj.metadata.namespace == "default"
    assert int(obj.metadata.resource_version) > 0
    gen = v1.create_namespaced_config_map("default", {"metadata": {"generateName": "gen-"}})
    assert gen.metadata.name.startswith("gen-") and len(gen.metadata.name) == 9
    # Status objects for errors.
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_config_map("default", cm("a"))
    assert exc.value.status == 409
    body = json.loads(exc.value.body)
    assert body["kind"] == "Status" and body["reason"] == "AlreadyExists"
    assert body["message"] == 'configmaps "a" already exists'
    with pytest.raises(ApiException) as exc:
        v1.read_namespaced_config_map("nope", "default")
    assert (
        exc.value.status == 404
        and json.loads(exc.value.body)["message"] == 'configmaps "nope" not found'
    )
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_config_map("nonexistent", cm("a"))
    assert exc.value.status == 404 and "namespaces" in exc.value.body
    status, body = http(
        emulator,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        {"metadata": {"name": "Bad_Name"}},
    )
    assert (
        status == 422
        and body["reason"] == "Invalid"
        and body["details"]["causes"][0]["field"] == "metadata.name"
    )
    orphan_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "a"}  # no uid
    status, body = http(
        emulator,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        {"metadata": {"name": "child", "ownerReferences": [orphan_ref]}},
    )
    assert (
        status == 422 and body["details"]["causes"][0]["field"] == "metadata.ownerReferences[0].uid"
    )


def test_list_selectors_and_namespaces(api_client: Any, emulator: ApiEmulator) -> None:
    v1 = client.CoreV1Api(api_client)
    v1.create_namespace({"metadata": {"name": "other"}})
    v1.create_namespaced_config_map("default", cm("a", app="x", tier="web"))
    v1.create_namespaced_config_map("default", cm("b", app="y"))
    v1.create_namespaced_config_map("other", cm("c", app="x"))
    names = lambda items: sorted(i.metadata.name for i in items)  # noqa: E731
    assert names(v1.list_namespaced_config_map("default", label_selector="app=x").items) == ["a"]
    assert names(v1.list_namespaced_config_map("default", label_selector="app in (x,y)").items) == [
        "a",
        "b",
    ]
    assert names(v1.list_namespaced_config_map("default", label_selector="!tier").items) == ["b"]
    assert names(v1.list_namespaced_config_map("default", label_selector="app!=x").items) == ["b"]
    assert names(v1.list_config_map_for_all_namespaces(label_selector="app=x").items) == ["a", "c"]
    assert names(
        v1.list_config_map_for_all_namespaces(field_selector="metadata.namespace=other").items
    ) == ["c"]
    assert names(
        v1.list_namespaced_config_map("default", field_selector="metadata.name=b").items
    ) == ["b"]
    assert "other" in names(v1.list_namespace().items)
    status, body = http(emulator, "GET", "/api/v1/namespaces/default/configmaps")
    assert status == 200 and body["kind"] == "ConfigMapList" and body["apiVersion"] == "v1"
    assert int(body["metadata"]["resourceVersion"]) >= 3
    # Deleting a namespace removes its contents.
    v1.delete_namespace("other")
    assert names(v1.list_config_map_for_all_namespaces(label_selector="app=x").items) == ["a"]


def test_put_conflict_status_subresource_and_generation(
    api_client: Any, emulator: ApiEmulator
) -> None:
    batch = client.BatchV1Api(api_client)
    job = {
        "metadata": {"name": "j"},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}
            },
        },
        "status": {"succeeded": 5},
    }
    created = batch.create_namespaced_job("default", job)
    assert created.metadata.generation == 1
    assert created.status.succeeded is None  # status is ignored on create
    assert created.spec.backoff_limit == 6 and created.spec.selector.match_labels  # defaulted
    # Status writes change only status, never generation.
    st = batch.patch_namespaced_job_status(
        "j", "default", {"status": {"active": 1}, "spec": {"parallelism": 3}}
    )
    assert st.status.active == 1 and st.spec.parallelism == 1 and st.metadata.generation == 1
    # Main-resource writes ignore status; spec changes bump generation; metadata-only do not.
    m = batch.patch_namespaced_job(
        "j", "default", {"status": {"active": 7}, "spec": {"suspend": False}}
    )
    assert m.status.active == 1 and m.metadata.generation == 2
    m = batch.patch_namespaced_job("j", "default", {"metadata": {"labels": {"a": "b"}}})
    assert m.metadata.generation == 2
    # PUT with a stale resourceVersion conflicts.
    stale = created
    stale.spec.suspend = True
    with pytest.raises(ApiException) as exc:
        batch.replace_namespaced_job("j", "default", stale)
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "Conflict"
    fresh = batch.read_namespaced_job("j", "default")
    fresh.spec.suspend = True
    replaced = batch.replace_namespaced_job("j", "default", fresh)
    assert replaced.spec.suspend is True and replaced.metadata.generation == 3
    assert int(replaced.metadata.resource_version) > int(fresh.metadata.resource_version)
    # Workload validation.
    bad = {
        "metadata": {"name": "bad"},
        "spec": {
            "podFailurePolicy": {"rules": []},
            "template": {"spec": {"restartPolicy": "OnFailure", "containers": [{"name": "c"}]}},
        },
    }
    with pytest.raises(ApiException) as exc:
        batch.create_namespaced_job("default", bad)
    causes = {c["field"] for c in json.loads(exc.value.body)["details"]["causes"]}
    assert causes == {"spec.template.spec.restartPolicy", "spec.template.spec.containers[0].image"}
    # The pod template is immutable (scheduling directives only while suspended and never started).
    with pytest.raises(ApiException) as exc:
        batch.patch_namespaced_job(
            "j", "default", {"spec": {"template": {"spec": {"restartPolicy": "OnFailure"}}}}
        )
    assert exc.value.status == 422 and "spec.template: Invalid value" in exc.value.body
    # A no-op write keeps the resourceVersion.
    again = batch.patch_namespaced_job("j", "default", {"spec": {"suspend": True}})
    assert again.metadata.resource_version == replaced.metadata.resource_version


def test_patch_types_and_server_side_apply(emulator: ApiEmulator) -> None:
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "a", "image": "i", "env": [{"name": "X", "value": "1"}]},
                    {"name": "b", "image": "j"},
                ]
            },
        }
    )
    path = "/api/v1/namespaces/default/pods/p"
    status, body = http(
        emulator,
        "PATCH",
        path,
        {"spec": {"containers": [{"name": "b", "image": "j2"}]}},
        "application/strategic-merge-patch+json",
    )
    assert status == 200
    assert [(c["name"], c["image"]) for c in body["spec"]["containers"]] == [
        ("a", "i"),
        ("b", "j2"),
    ]
    status, body = http(
        emulator,
        "PATCH",
        path,
        [{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}],
        "application/json-patch+json",
    )
    assert status == 200 and body["metadata"]["labels"] == {"x": "y"}
    status, body = http(
        emulator,
        "PATCH",
        path,
        {"metadata": {"labels": {"x": None}}},
        "application/merge-patch+json",
    )
    assert status == 200 and "labels" not in body["metadata"]
    status, body = http(
        emulator,
        "PATCH",
        path,
        {"metadata": {"resourceVersion": "1"}},
        "application/merge-patch+json",
    )
    assert status == 409
    # Server-side apply creates when absent (201), then updates (200).
    cmpath = "/api/v1/namespaces/default/configmaps/applied?fieldManager=test"
    doc = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\ndata:\n  a: '1'\n"
    status, body = http(emulator, "PATCH", cmpath, doc, "application/apply-patch+yaml")
    assert status == 201 and body["data"] == {"a": "1"}
    status, body = http(
        emulator, "PATCH", cmpath, doc.replace("'1'", "'2'"), "application/apply-patch+yaml"
    )
    assert status == 200 and body["data"] == {"a": "2"}
    # Fields the manager applied before and no longer applies are removed; others' stay.
    emulator.patch("v1", "ConfigMap", "applied", {"data": {"other": "x"}}, namespace="default")
    doc2 = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\ndata:\n  b: '3'\n"
    status, body = http(emulator, "PATCH", cmpath, doc2, "application/apply-patch+yaml")
    assert status == 200 and body["data"] == {"b": "3", "other": "x"}
    status, body = http(emulator, "PATCH", path, "{}", "text/plain")
    assert status == 415


def test_watch_resource_version_and_timeout(api_client: Any, emulator: ApiEmulator) -> None:
    v1 = client.CoreV1Api(api_client)
    v1.create_namespaced_config_map("default", cm("a"))
    lst = v1.list_namespaced_config_map("default")
    rv = lst.metadata.resource_version
    v1.patch_namespaced_config_map("a", "default", {"data": {"k": "2"}})
    v1.create_namespaced_config_map("default", cm("b"))
    v1.delete_namespaced_config_map("a", "default")
    w = watch.Watch()
    events = [
        (e["type"], e["object"].metadata.name)
        for e in w.stream(
            v1.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=1
        )
    ]
    assert events == [("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    # Without a resourceVersion: synthetic ADDED for the current state, then live events.
    seen: list[tuple[str, str]] = []

    def later() -> None:
        time.sleep(0.3)
        emulator.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})

    threading.Thread(target=later).start()
    t0 = time.monotonic()
    for e in watch.Watch().stream(v1.list_namespaced_config_map, "default", timeout_seconds=1):
        seen.append((e["type"], e["object"].metadata.name))
    assert seen == [("ADDED", "b"), ("ADDED", "c")]
    assert time.monotonic() - t0 < 5


def test_finalizers_and_cascade(api_client: Any, emulator: ApiEmulator) -> None:
    v1 = client.CoreV1Api(api_client)
    owner = v1.create_namespaced_config_map(
        "default", {"metadata": {"name": "owner", "finalizers": ["x/y"]}}
    )
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    v1.create_namespaced_config_map(
        "default", {"metadata": {"name": "child", "ownerReferences": [ref]}}
    )
    child = v1.read_namespaced_config_map("child", "default")
    v1.create_namespaced_config_map(
        "default",
        {
            "metadata": {
                "name": "grandchild",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": "child",
                        "uid": child.metadata.uid,
                    }
                ],
            }
        },
    )
    v1.delete_namespaced_config_map("owner", "default")
    marked = v1.read_namespaced_config_map("owner", "default")
    assert marked.metadata.deletion_timestamp is not None
    assert v1.read_namespaced_config_map("child", "default")  # not yet collected
    v1.patch_namespaced_config_map("owner", "default", {"metadata": {"finalizers": None}})
    names = sorted(i.metadata.name for i in v1.list_namespaced_config_map("default").items)
    assert names == []  # owner, child and grandchild are gone
    # Orphan propagation keeps dependents, minus the owner reference.
    o2 = v1.create_namespaced_config_map("default", {"metadata": {"name": "o2"}})
    v1.create_namespaced_config_map(
        "default",
        {
            "metadata": {
                "name": "kid",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "o2", "uid": o2.metadata.uid}
                ],
            }
        },
    )
    v1.delete_namespaced_config_map("o2", "default", propagation_policy="Orphan")
    kid = v1.read_namespaced_config_map("kid", "default")
    assert not kid.metadata.owner_references


def test_in_process_api(emulator: ApiEmulator) -> None:
    obj = emulator.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    assert (
        emulator.get("v1", "ConfigMap", "x", "default")["metadata"]["uid"] == obj["metadata"]["uid"]
    )
    assert emulator.get("v1", "ConfigMap", "y", "default") is None
    with pytest.raises(ApiError) as exc:
        emulator.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    assert exc.value.code == 409
    emulator.patch("v1", "ConfigMap", "x", {"data": {"a": "b"}}, namespace="default")
    assert emulator.list("v1", "ConfigMap", "default")[0]["data"] == {"a": "b"}
    assert emulator.delete("v1", "ConfigMap", "x", "default") is not None
    assert emulator.delete("v1", "ConfigMap", "x", "default") is None


def test_discovery_version_openapi(emulator: ApiEmulator) -> None:
    assert http(emulator, "GET", "/version")[1]["minor"] == "32"
    assert http(emulator, "GET", "/api")[1]["versions"] == ["v1"]
    groups = {g["name"] for g in http(emulator, "GET", "/apis")[1]["groups"]}
    assert {
        "batch",
        "apiextensions.k8s.io",
        "rbac.authorization.k8s.io",
        "coordination.k8s.io",
    } <= groups
    res = {r["name"] for r in http(emulator, "GET", "/apis/batch/v1")[1]["resources"]}
    assert {"jobs", "jobs/status"} <= res
    index = http(emulator, "GET", "/openapi/v3")[1]["paths"]
    assert "api/v1" in index and "apis/batch/v1" in index
    doc = http(emulator, "GET", index["apis/batch/v1"]["serverRelativeURL"].split("?")[0])[1]
    patch = doc["paths"]["/apis/batch/v1/namespaces/{namespace}/jobs/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "Job"
    assert any(p["name"] == "fieldValidation" for p in patch["parameters"])
