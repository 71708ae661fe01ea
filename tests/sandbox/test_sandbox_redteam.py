"""The sandbox refuses a write's unknown options as the API server does (red-team pass, issue
38): a mistyped ``dryRun`` must never write for real, an unknown ``fieldValidation`` or
``propagationPolicy`` is a 422, a non-integer ``gracePeriodSeconds`` a 400; nothing changes."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
from npu_lora_sandbox.emulator import ApiEmulator

CM = "/api/v1/namespaces/default/configmaps"


def _send(emu: ApiEmulator, method: str, path: str, query: list[tuple[str, str]], body: Any) -> int:
    url = emu.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {emu.admin_token}",
            "Content-Type": "application/merge-patch+json"
            if method == "PATCH"
            else "application/json",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=10, context=emu.tls.client_context()) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _cm(name: str, value: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"k": value},
    }


@pytest.mark.parametrize(
    "query",
    [
        [("dryRun", "Maybe")],
        [("dryRun", "all")],
        [("dryRun", "All"), ("dryRun", "x")],
        [("fieldValidation", "Nope")],
        [("fieldValidation", "strict ")],
    ],
)
def test_a_create_with_an_unknown_option_is_refused_and_writes_nothing(emulator, query):
    assert _send(emulator, "POST", CM, query, _cm("c1")) == 422
    assert _send(emulator, "GET", CM + "/c1", [], None) == 404


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_an_update_with_an_unknown_dry_run_changes_nothing(emulator, method):
    emulator.create({**_cm("c2"), "metadata": {"name": "c2", "namespace": "default"}})
    body = _cm("c2", "2") if method == "PUT" else {"data": {"k": "2"}}
    assert _send(emulator, method, CM + "/c2", [("dryRun", "Al")], body) == 422
    assert emulator.get("v1", "ConfigMap", "c2", namespace="default")["data"] == {"k": "1"}


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ([("propagationPolicy", "Nope")], 422),
        ([("gracePeriodSeconds", "abc")], 400),
        ([("dryRun", "yes")], 422),
    ],
)
def test_a_delete_with_a_bad_option_deletes_nothing(emulator, query, code):
    emulator.create({**_cm("c3"), "metadata": {"name": "c3", "namespace": "default"}})
    assert _send(emulator, "DELETE", CM + "/c3", query, None) == code
    assert emulator.get("v1", "ConfigMap", "c3", namespace="default") is not None


def test_the_known_options_still_work(emulator):
    assert _send(emulator, "POST", CM, [("dryRun", "All")], _cm("c4")) == 201
    assert _send(emulator, "GET", CM + "/c4", [], None) == 404
    assert _send(emulator, "POST", CM, [("fieldValidation", "Strict")], _cm("c4")) == 201
    assert _send(emulator, "DELETE", CM + "/c4", [("propagationPolicy", "Background")], None) == 200


@pytest.mark.parametrize(
    "meta",
    [
        {"labels": {"npu-lora.io/run": "x\ny"}},
        {"labels": {"a b": "c"}},
        {"labels": {"app": "x,y!=z"}},
        {"labels": {"app": "a" * 64}},
        {"labels": {"app": 5}},
        {"labels": {"Bad_Prefix.io/app": "x"}},
        {"labels": ["app"]},
        {"annotations": {"a\nb": "c"}},
        {"annotations": {"ok": 5}},
    ],
)
def test_invalid_labels_and_annotations_are_refused_never_stored(emulator, meta):
    """A label with a newline or a selector operator would be matched by no selector (or by the
    wrong one): the API server refuses it with 422, so does the sandbox."""
    body = {**_cm("c5"), "metadata": {"name": "c5", **meta}}
    assert _send(emulator, "POST", CM, [], body) == 422
    assert _send(emulator, "GET", CM + "/c5", [], None) == 404
    emulator.create({**_cm("c6"), "metadata": {"name": "c6", "namespace": "default"}})
    assert _send(emulator, "PATCH", CM + "/c6", [], {"metadata": meta}) == 422


def test_valid_labels_and_annotations_pass(emulator):
    meta = {
        "labels": {"npu-lora.io/run": "r1", "app": "", "a.b-c_d": "X.y-z_1"},
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\n}"},
    }
    assert _send(emulator, "POST", CM, [], {**_cm("c7"), "metadata": {"name": "c7", **meta}}) == 201


@pytest.mark.parametrize(
    "body",
    [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c8"}, "data": {}},
        {"apiVersion": "batch/v1", "kind": "ConfigMap", "metadata": {"name": "c8"}},
    ],
)
def test_a_body_of_another_type_is_refused_not_stored_as_this_one(emulator, body):
    assert _send(emulator, "POST", CM, [], body) == 400
    assert _send(emulator, "GET", CM + "/c8", [], None) == 404
    emulator.create({**_cm("c9"), "metadata": {"name": "c9", "namespace": "default"}})
    assert _send(emulator, "PUT", CM + "/c9", [], {**body, "metadata": {"name": "c9"}}) == 400
    assert emulator.get("v1", "ConfigMap", "c9", namespace="default")["data"] == {"k": "1"}


# --- ConfigMap/Secret keys and volume item paths are file names inside the volume -----------


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "ConfigMap", "data": {"../../../escaped": "x"}},
        {"kind": "ConfigMap", "data": {"/etc/x": "x"}},
        {"kind": "ConfigMap", "data": {"..": "x"}},
        {"kind": "ConfigMap", "data": {"a": 5}},
        {"kind": "ConfigMap", "binaryData": {"a/b": "eA=="}},
        {"kind": "Secret", "stringData": {"../x": "y"}},
    ],
)
def test_config_keys_that_are_no_file_names_are_refused(emulator, body):
    kind = body.pop("kind")
    plural = "configmaps" if kind == "ConfigMap" else "secrets"
    obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": "k1"}, **body}
    assert _send(emulator, "POST", f"/api/v1/namespaces/default/{plural}", [], obj) == 422


def _pod_with_item(path: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p1", "namespace": "default"},
        "spec": {
            "containers": [
                {"name": "c", "image": "x", "volumeMounts": [{"name": "v", "mountPath": "/x"}]}
            ],
            "volumes": [
                {"name": "v", "configMap": {"name": "cfg", "items": [{"key": "a", "path": path}]}}
            ],
        },
    }


@pytest.mark.parametrize("path", ["../../../escaped", "/etc/escaped", "a/../../b", ""])
def test_a_volume_item_path_that_leaves_the_volume_is_refused(emulator, path):
    assert (
        _send(emulator, "POST", "/api/v1/namespaces/default/pods", [], _pod_with_item(path)) == 422
    )


@pytest.mark.parametrize("path", ["../../../escaped", "/tmp/escaped-abs", "a/../../escaped"])
def test_the_kubelet_never_writes_an_item_outside_the_pod(emulator, tmp_path, path):
    """Defence in depth: a pod that reached the kubelet with such a path does not start."""
    from npu_lora_sandbox.kubelet import LocalKubelet
    from npu_lora_sandbox.podenv import _StartError

    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg", "namespace": "default"},
            "data": {"a": "1"},
        }
    )
    kl = LocalKubelet(emulator, root=tmp_path / "sandbox")
    pod = _pod_with_item(path)
    pdir = tmp_path / "sandbox" / "pods" / "p1"
    pdir.mkdir(parents=True)
    with pytest.raises(_StartError, match="not a relative file name"):
        kl._materialise(pod, pod["spec"]["containers"][0], pdir, lambda v: v)
    assert not list(tmp_path.rglob("escaped*"))
    assert not __import__("pathlib").Path("/tmp/escaped-abs").exists()


@pytest.mark.parametrize("name", ["../../../escaped-vol", "a/b", "UPPER", "x" * 64])
def test_a_volume_name_that_is_no_dns_label_is_refused(emulator, tmp_path, name):
    """The kubelet makes a directory of a volume's name: ``../x`` made (and, with a configMap,
    filled) a directory outside the pod."""
    from npu_lora_sandbox.kubelet import LocalKubelet
    from npu_lora_sandbox.podenv import _StartError

    pod = _pod_with_item("a")
    pod["spec"]["volumes"] = [{"name": name, "emptyDir": {}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": name, "mountPath": "/x"}]
    assert _send(emulator, "POST", "/api/v1/namespaces/default/pods", [], pod) == 422
    kl = LocalKubelet(emulator, root=tmp_path / "sandbox")
    pdir = tmp_path / "sandbox" / "pods" / "p1"
    pdir.mkdir(parents=True)
    with pytest.raises(_StartError, match="not a DNS-1123 label"):
        kl._mounts(pod, pod["spec"]["containers"][0], pdir)
    assert not list(tmp_path.rglob("escaped*"))
