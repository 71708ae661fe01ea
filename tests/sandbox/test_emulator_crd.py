"""CRDs in the emulator: discovery, structural schema validation/defaulting/pruning, CEL rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from npu_lora_sandbox import schema as sch
from npu_lora_sandbox.emulator import ApiEmulator, ApiError

GROUP, VERSION, PLURAL = "example.com", "v1", "widgets"


def widget(obj_name: str, /, size: Any = 3, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": obj_name},
        "spec": {"size": size, **spec},
    }


def invalid(co: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(ApiException) as exc:
        co.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    assert exc.value.status == 422, exc.value.body
    status = json.loads(exc.value.body)
    assert status["reason"] == "Invalid" and status["details"]["kind"] == "Widget"
    return status


@pytest.fixture
def co(emulator: ApiEmulator, api_client: Any, make_crd: Any) -> client.CustomObjectsApi:
    emulator.load_crd(make_crd())
    return client.CustomObjectsApi(api_client)


def test_crd_through_api_registers_discovery(
    api_client: Any, emulator: ApiEmulator, make_crd: Any
) -> None:
    ext = client.ApiextensionsV1Api(api_client)
    crd = ext.create_custom_resource_definition(make_crd())
    assert crd.metadata.uid
    got = ext.read_custom_resource_definition("widgets.example.com")
    assert {c.type for c in got.status.conditions if c.status == "True"} >= {
        "Established",
        "NamesAccepted",
    }
    resources = client.ApisApi(api_client).get_api_versions()
    assert "example.com" in {g.name for g in resources.groups}
    rl = client.CustomObjectsApi(api_client).get_api_resources(GROUP, VERSION)
    entry = next(r for r in rl.resources if r.name == "widgets")
    assert entry.short_names == ["wd"] and entry.categories == ["examples"] and entry.namespaced
    assert "widgets/status" in {r.name for r in rl.resources}
    # Deleting the CRD removes the resource and its objects.
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, widget("w")
    )
    ext.delete_custom_resource_definition("widgets.example.com")
    with pytest.raises(ApiException) as exc:
        client.CustomObjectsApi(api_client).list_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL
        )
    assert exc.value.status == 404


def test_defaults_pruning_and_status_separation(co: client.CustomObjectsApi) -> None:
    obj = co.create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        widget(
            "w",
            unknown=1,
            extra={"free": {"form": 1}},
            labels={"a": "b"},
            port="http",
            status={"x": 1},
        ),
    )
    spec = obj["spec"]
    assert spec["maxSize"] == 10 and spec["color"] == "red" and spec["mutable"] is False
    assert "unknown" not in spec and spec["extra"] == {"free": {"form": 1}}
    assert "status" not in obj and obj["metadata"]["generation"] == 1
    st = co.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "w",
        {"status": {"phase": "Running"}, "spec": {"size": 9}},
    )
    assert st["status"] == {"phase": "Running"} and st["spec"]["size"] == 3
    # Strict field validation rejects unknown fields like the apiserver.
    with pytest.raises(ApiException) as exc:
        co.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, widget("strict", bogus=1), field_validation="Strict"
        )
    assert exc.value.status == 400
    assert 'unknown field "spec.bogus"' in json.loads(exc.value.body)["message"]


def test_openapi_validation_messages(co: client.CustomObjectsApi) -> None:
    status = invalid(co, widget("w", size=0))
    assert status["message"] == (
        'Widget.example.com "w" is invalid: spec.size: Invalid value: 0: '
        "spec.size in body should be greater than or equal to 1"
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 0: spec.size in body should be greater than or equal to 1",
            "field": "spec.size",
        }
    ]
    msg = invalid(co, widget("w", color="pink"))["message"]
    assert 'spec.color: Unsupported value: "pink": supported values: "red", "green", "blue"' in msg
    msg = invalid(co, widget("w", size="big"))["message"]
    assert (
        'spec.size: Invalid value: "string": spec.size in body must be of type integer: "string"'
        in msg
    )
    msg = invalid(
        co,
        {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}},
    )["message"]
    assert "spec.size: Required value" in msg
    msg = invalid(co, widget("w", name="ABC"))["message"]
    assert "spec.name in body should match '^[a-z]+$'" in msg
    msg = invalid(co, widget("w", name="abcdefghij"))["message"]
    assert "spec.name: Too long: may not be more than 8 bytes" in msg
    msg = invalid(co, widget("w", rate=0))["message"]
    assert "spec.rate in body should be greater than 0" in msg
    msg = invalid(co, widget("w", tags=["a", "b", "c", "d"]))["message"]
    assert "spec.tags: Too many: 4: must have at most 3 items" in msg
    msg = invalid(co, widget("w", port=1.5))["message"]
    assert "spec.port" in msg
    msg = invalid(co, widget("w", note=None, size=101))["message"]
    assert msg.startswith('Widget.example.com "w" is invalid: spec.size') and "note" not in msg
    # Several causes: bracketed list like the apiserver.
    msg = invalid(co, widget("w", size=0, color="pink"))["message"]
    assert msg.startswith('Widget.example.com "w" is invalid: [') and msg.endswith("]")


def test_cel_rules(co: client.CustomObjectsApi) -> None:
    msg = invalid(co, widget("w", size=20))["message"]
    assert (
        msg
        == 'Widget.example.com "w" is invalid: spec: Invalid value: "object": size must not exceed maxSize'
    )
    msg = invalid(co, widget("w", training={"steps": 0, "seqLen": 12}))["message"]
    assert msg == (
        'Widget.example.com "w" is invalid: spec.training: Invalid value: "object": '
        "steps must be positive and seqLen a multiple of 8, got 12"
    )
    co.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, widget("w", training={"steps": 5, "seqLen": 16})
    )
    # Transition rule (oldSelf) only on update.
    with pytest.raises(ApiException) as exc:
        co.patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "w", {"spec": {"size": 4}}
        )
    assert exc.value.status == 422 and "size is immutable unless mutable" in exc.value.body
    assert (
        co.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w")["spec"]["size"] == 3
    )
    out = co.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "w", {"spec": {"size": 4, "mutable": True}}
    )
    assert out["spec"]["size"] == 4 and out["metadata"]["generation"] == 2


def test_cel_functions_direct() -> None:
    schema = {
        "type": "object",
        "properties": {
            "lr": {"type": "number"},
            "mods": {"type": "array", "items": {"type": "string"}},
            "name": {"type": "string"},
            "m": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        "x-kubernetes-validations": [
            {"rule": "self.lr > 0.0 && self.lr < 1.0", "message": "lr"},
            {
                "rule": "size(self.mods) > 0 && self.mods.all(x, x in ['q_proj', 'v_proj'])",
                "message": "mods",
            },
            {
                "rule": "self.name.matches('^[a-z]+$') && self.name.startsWith('a')",
                "message": "name",
            },
            {"rule": "!has(self.m) || 'a' in self.m", "message": "map"},
            {"rule": "self.name.size() <= 5", "message": "len"},
            {"rule": "self.name.lowerAscii() == self.name", "message": "lower"},
            {"rule": "isURL(self.name)", "message": "unsupported by cel-python: skipped"},
        ],
    }
    ok = {"lr": 0.5, "mods": ["q_proj"], "name": "abc", "m": {"a": 1}}
    assert sch.validate(ok, schema) == []
    assert sch.validate({**ok, "lr": 1}, schema)[0].body.endswith(
        "lr"
    )  # integer JSON as a CEL double
    bad = sch.validate({"lr": 0.1, "mods": ["x"], "name": "Bcdefgh", "m": {"b": 1}}, schema)
    assert [c.body.rsplit(": ", 1)[1] for c in bad] == ["mods", "name", "map", "len", "lower"]


def test_in_process_invalid_leaves_state(emulator: ApiEmulator, make_crd: Any) -> None:
    emulator.load_crd(make_crd())
    emulator.create(widget("w"))
    rv = emulator.get("example.com/v1", "Widget", "w", "default")["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as exc:
        emulator.patch("example.com/v1", "Widget", "w", {"spec": {"size": -1}}, namespace="default")
    assert exc.value.code == 422
    assert (
        emulator.get("example.com/v1", "Widget", "w", "default")["metadata"]["resourceVersion"]
        == rv
    )
