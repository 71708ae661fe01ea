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
