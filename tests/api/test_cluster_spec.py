"""The cluster fields of the spec: ``device.product``, ``device.partition`` (the backend
registry's names, refused where they cannot apply, with the field named) and ``managedBy``."""

from __future__ import annotations

from typing import Any

import pytest
from npu_lora.api import backends as registry
from npu_lora.api import memory
from npu_lora.api.v1alpha1 import MANAGED_BY, MoEFinetuneSpec
from npu_lora_operator.crd import openapi_schema
from pydantic import ValidationError

FURIOSA = registry.entry("furiosa")
NODE = FURIOSA.node
assert NODE is not None


def spec(device: dict[str, Any] | None = None, **over: Any) -> MoEFinetuneSpec:
    doc: dict[str, Any] = {
        "model": {"preset": "tiny-qwen3-moe"},
        "data": {"path": "example:nsmc-mini"},
        "device": device or {},
        **over,
    }
    return MoEFinetuneSpec.model_validate(doc)


def test_products_and_partitions_come_from_the_registry() -> None:
    assert registry.products() == NODE.products == ("rngd", "rngd-s", "rngd-max")
    assert registry.partitions() == ("1core.6gb", "2core.12gb", "4core.24gb")
    assert [FURIOSA.partition_resource(p) for p in registry.partitions()] == [
        f"{FURIOSA.resource}-1core.6gb",
        f"{FURIOSA.resource}-2core.12gb",
        f"{FURIOSA.resource}-4core.24gb",
    ]
    dev = openapi_schema()["properties"]["spec"]["properties"]["device"]
    assert dev["properties"]["product"]["enum"] == list(registry.products())
    assert dev["properties"]["partition"]["enum"] == list(registry.partitions())
    rules = [r["rule"] for r in dev["x-kubernetes-validations"]]
    assert any("has(self.product)" in r for r in rules)
    assert any("has(self.partition)" in r for r in rules)


def test_product_and_partition_accepted_on_the_backend_that_has_them() -> None:
    s = spec({"backend": "furiosa", "cards": 2, "product": "rngd-max", "partition": "2core.12gb"})
    assert s.device.node_backend is FURIOSA
    # auto with cards resolves to the first accelerator, which has them
    s = spec({"backend": "auto", "cards": 1, "product": "rngd-s"})
    assert s.device.node_backend is FURIOSA


@pytest.mark.parametrize(
    "device, field",
    [
        ({"backend": "cpu", "cards": 0, "product": "rngd"}, "device.product"),
        ({"backend": "cuda", "cards": 1, "partition": "1core.6gb"}, "device.partition"),
        ({"backend": "auto", "cards": 0, "product": "rngd-max"}, "device.product"),
    ],
)
def test_product_or_partition_without_such_a_backend_is_refused(
    device: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        spec(device)


def test_an_unknown_product_or_partition_is_refused_naming_the_values() -> None:
    with pytest.raises(ValidationError, match="rngd-max"):
        spec({"backend": "furiosa", "product": "rngd-ultra"})
    with pytest.raises(ValidationError, match=r"2core\.12gb"):
        spec({"backend": "furiosa", "partition": "3core.18gb"})


def test_a_partition_too_small_for_the_device_weights_is_refused() -> None:
    """Each rank holds the device side whole: Qwen3-30B-A3B's embeddings, attention and head are
    6.2 GB in float32 (more than a 1-core partition's 6 GB), 3.1 GB in bfloat16."""
    big = {"preset": "qwen3-30b-a3b"}
    cfg = memory.text_config(memory.preset_config("qwen3-30b-a3b"))
    s = spec({"backend": "furiosa", "dtype": "bfloat16", "partition": "1core.6gb"}, model=big)
    assert 3.0e9 < memory.device_weight_bytes(s, cfg) < 3.3e9
    with pytest.raises(ValidationError, match=r"device.partition '1core.6gb' holds 6 GB"):
        spec({"backend": "furiosa", "partition": "1core.6gb"}, model=big)
    spec({"backend": "furiosa", "partition": "2core.12gb"}, model=big)  # fits


def test_managed_by_defaults_to_ours_and_is_immutable_in_the_schema() -> None:
    assert spec().managed_by == MANAGED_BY == "npu-lora.io/operator"
    assert spec(managedBy="kueue.x-k8s.io/multikueue").managed_by == "kueue.x-k8s.io/multikueue"
    with pytest.raises(ValidationError, match="managedBy"):
        spec(managedBy="not a controller")
    spec_schema = openapi_schema()["properties"]["spec"]
    assert spec_schema["properties"]["managedBy"]["default"] == MANAGED_BY
    assert {
        "rule": "self.managedBy == oldSelf.managedBy",
        "message": "managedBy is immutable",
        "fieldPath": ".managedBy",
    } in spec_schema["x-kubernetes-validations"]


def test_hugepages_are_limits_equal_to_requests_in_whole_pages() -> None:
    ok = spec(resources={"limits": {"hugepages-2Mi": "58Gi", "memory": "32Gi"}})
    assert ok.resources.hugepages_bytes() == 58 << 30
    spec(resources={"requests": {"hugepages-2Mi": "2Gi"}, "limits": {"hugepages-2Mi": "2048Mi"}})
    with pytest.raises(ValidationError, match=r"spec.resources.limits.hugepages-2Mi must be set"):
        spec(resources={"requests": {"hugepages-2Mi": "2Gi"}})
    with pytest.raises(ValidationError, match=r"requests.hugepages-2Mi must equal"):
        spec(resources={"requests": {"hugepages-2Mi": "2Gi"}, "limits": {"hugepages-2Mi": "4Gi"}})
    with pytest.raises(ValidationError, match="whole number of 2 MiB pages"):
        spec(resources={"limits": {"hugepages-2Mi": "3Mi"}})


def test_hugepage_expert_bytes_counts_whole_tensors_in_layer_order() -> None:
    """Qwen3-30B-A3B bf16: per layer gate_up 805 MB + down 403 MB; 58Gi holds all 48 layers,
    2Gi the first layer's two tensors and the second's gate_up (then nothing fits: greedy, as
    npu_lora.moe.pages.place_experts places them)."""
    s = spec(model={"preset": "qwen3-30b-a3b"}, moe={"hostDtype": "bfloat16"})
    cfg = memory.text_config(memory.preset_config("qwen3-30b-a3b"))
    layer = 128 * 3 * 768 * 2048 * 2
    assert memory.hugepage_expert_bytes(s, cfg, 58 << 30) == 48 * layer
    gate_up = 128 * 2 * 768 * 2048 * 2
    assert memory.hugepage_expert_bytes(s, cfg, 2 << 30) == layer + gate_up
    assert memory.hugepage_expert_bytes(s, cfg, 1 << 20) == 0


def test_the_server_refuses_what_the_models_refuse() -> None:
    """The CRD's CEL (run by the sandbox's apiserver schema code): product/partition need a
    backend with node facts; managedBy never changes."""
    from npu_lora_sandbox.schema import apply_defaults, validate

    schema = openapi_schema()

    def obj(device: dict[str, Any], **spec_over: Any) -> dict[str, Any]:
        o = {
            "metadata": {"name": "r"},
            "spec": {
                "model": {"preset": "tiny-qwen3-moe"},
                "data": {"path": "x", "volume": {"claimName": "data"}},
                "device": device,
                **spec_over,
            },
        }
        apply_defaults(o, schema)
        return o

    def errors(new: dict[str, Any], old: dict[str, Any] | None = None) -> str:
        causes = validate(new, schema, old=old, has_old=old is not None)
        return "\n".join(str(c) for c in causes)

    assert errors(obj({"backend": "furiosa", "product": "rngd-max"})) == ""
    assert errors(obj({"backend": "auto", "cards": 1, "partition": "1core.6gb"})) == ""
    assert "product needs backend furiosa" in errors(obj({"backend": "cpu", "product": "rngd"}))
    assert "partition needs backend furiosa" in errors(
        obj({"backend": "auto", "cards": 0, "partition": "2core.12gb"})
    )
    old = obj({})
    assert old["spec"]["managedBy"] == MANAGED_BY  # defaulted by the server
    assert errors(obj({}, managedBy=MULTIKUEUE), old).count("managedBy is immutable") == 1
    assert errors(obj({}), old) == ""


MULTIKUEUE = "kueue.x-k8s.io/multikueue"
