"""The sandbox's node carries the backend registry's discovery labels and partitioned resources,
and its scheduler honours a pod's required node affinity against the Node object as it is now
(``kubectl label node`` reschedules a pending pod)."""

from __future__ import annotations

from typing import Any

import pytest
from npu_lora.api import backends as registry
from npu_lora_sandbox.emulator import ApiEmulator
from npu_lora_sandbox.kubelet import LocalKubelet
from npu_lora_sandbox.pods import node_term_matches


def job(name: str, *, pod_spec: dict | None = None, container: dict | None = None) -> dict:
    c = {"name": "main", "image": "python:3.11", "command": ["python", "-c", "pass"]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{**c, **(container or {})}],
                    **(pod_spec or {}),
                }
            }
        },
    }


def pods_of(emu: ApiEmulator, name: str) -> list[dict[str, Any]]:
    return emu.list("v1", "Pod", "default", label_selector=f"job-name={name}")


FURIOSA = registry.entry("furiosa")
NODE = FURIOSA.node
assert NODE is not None


def _affinity(*exprs: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(exprs)}]
            }
        }
    }


def _product(value: str) -> dict[str, Any]:
    return {"key": NODE.product_label, "operator": "In", "values": [value]}


def _scheduled(emu: ApiEmulator, name: str) -> dict[str, Any] | None:
    for p in pods_of(emu, name):
        for c in p["status"].get("conditions") or []:
            if c["type"] == "PodScheduled":
                return c
    return None


def test_the_node_advertises_the_registry_labels_and_partitions(
    emulator: ApiEmulator, kubelet: LocalKubelet
) -> None:
    node = emulator.get("v1", "Node", kubelet.node_name)
    labels, alloc = node["metadata"]["labels"], node["status"]["allocatable"]
    assert labels[NODE.family_label] == NODE.family
    assert labels[NODE.product_label] == NODE.products[0]
    assert labels[NODE.count_label] == "8" and labels[NODE.driver_label]
    assert alloc[FURIOSA.resource] == "8"
    for part, per_card in NODE.partitions:
        assert alloc[FURIOSA.partition_resource(part)] == str(8 * per_card)


@pytest.mark.parametrize(
    ("op", "values", "labels", "ok"),
    [
        ("In", ["a", "b"], {"k": "b"}, True),
        ("In", ["a"], {}, False),
        ("NotIn", ["a"], {"k": "b"}, True),
        ("NotIn", ["a"], {}, True),
        ("NotIn", ["b"], {"k": "b"}, False),
        ("Exists", [], {"k": ""}, True),
        ("DoesNotExist", [], {"k": "x"}, False),
        ("Gt", ["4"], {"k": "8"}, True),
        ("Lt", ["4"], {"k": "8"}, False),
        ("Gt", ["4"], {"k": "x"}, False),
    ],
)
def test_node_selector_operators(op: str, values: list[str], labels: dict, ok: bool) -> None:
    term = {"matchExpressions": [{"key": "k", "operator": op, "values": values}]}
    assert node_term_matches(term, {"labels": labels, "fields": {}}) is ok


def test_an_empty_term_matches_no_node_and_fields_match_the_name() -> None:
    node = {"labels": {"a": "1"}, "fields": {"metadata.name": "n1"}}
    assert not node_term_matches({}, node)
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert node_term_matches(by_name, node)


def test_a_product_runs_only_on_a_node_labelled_so(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any, kubectl: Any
) -> None:
    """The node is an ``rngd``: a pod that requires ``rngd-max`` stays Pending, Unschedulable;
    once the node is labelled ``rngd-max`` it is bound and runs; a pod requiring ``rngd`` now
    is the one that waits."""
    emulator.create(job("wants-max", pod_spec={"affinity": _affinity(_product("rngd-max"))}))
    cond = wait_for(lambda: _scheduled(emulator, "wants-max"), timeout=20)
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable"
    assert "didn't match Pod's node affinity/selector" in cond["message"]
    assert not pods_of(emulator, "wants-max")[0]["spec"].get("nodeName")

    kubectl("label", "node", kubelet.node_name, f"{NODE.product_label}=rngd-max", "--overwrite")
    pod = wait_for(
        lambda: [
            p for p in pods_of(emulator, "wants-max") if p["status"].get("phase") == "Succeeded"
        ],
        timeout=30,
    )[0]
    assert pod["spec"]["nodeName"] == kubelet.node_name

    emulator.create(job("wants-rngd", pod_spec={"affinity": _affinity(_product("rngd"))}))
    cond = wait_for(lambda: _scheduled(emulator, "wants-rngd"), timeout=20)
    assert cond["reason"] == "Unschedulable"


def test_a_partition_request_is_scheduled_against_the_partitioned_capacity(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any
) -> None:
    res = FURIOSA.partition_resource("4core.24gb")
    emulator.create(job("part", container={"resources": {"limits": {res: "16"}}}))
    pod = wait_for(
        lambda: [p for p in pods_of(emulator, "part") if p["status"].get("phase") == "Succeeded"],
        timeout=30,
    )[0]
    assert pod["spec"]["nodeName"] == kubelet.node_name
    emulator.create(job("part17", container={"resources": {"limits": {res: "17"}}}))
    cond = wait_for(lambda: _scheduled(emulator, "part17"), timeout=20)
    assert f"Insufficient {res}" in cond["message"]
