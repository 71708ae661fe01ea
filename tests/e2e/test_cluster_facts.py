"""The cluster conventions end to end (real kubectl → emulator → real kopf operator → local
kubelet → `npu-lora run`): a run for one product waits for a node labelled so and gets its
partitioned resource; progress as Kubeflow Trainer names it (``status.trainerStatus`` and the
PROGRESS column); a run another controller manages (``spec.managedBy``, MultiKueue) gets
nothing from us and its status is left as that controller writes it."""

from __future__ import annotations

import importlib.util
import json

import pytest
from e2e_harness import Cluster, OperatorProcess, manifest
from npu_lora.api import backends as registry
from npu_lora.api import record

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="the worker needs torch (npu-lora[worker])",
    ),
]

FURIOSA = registry.entry("furiosa")
NODE = FURIOSA.node
assert NODE is not None
MULTIKUEUE = "kueue.x-k8s.io/multikueue"


def _reasons(cluster: Cluster, name: str) -> set[str]:
    return {c.get("reason") for c in cluster.status(name).get("conditions") or []}


def test_product_partition_progress_and_a_run_managed_elsewhere(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster.apply(manifest("foreign", steps=4, managedBy=MULTIKUEUE))
    # auto with a card: the first accelerator's node facts (the sandbox's pods run on the CPU)
    device = {"backend": "auto", "cards": 1, "product": "rngd-max", "partition": "2core.12gb"}
    cluster.apply(manifest("maxrun", steps=6, device=device))

    # the product: a required node affinity with the family; the partition instead of a card
    operator.wait(lambda: cluster.jobs("maxrun"), 30, "the Job of maxrun")
    (job,) = cluster.jobs("maxrun")
    pod_spec = job["spec"]["template"]["spec"]
    (term,) = pod_spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": NODE.family_label, "operator": "In", "values": [NODE.family]},
        {"key": NODE.product_label, "operator": "In", "values": ["rngd-max"]},
    ]
    res = pod_spec["containers"][0]["resources"]
    assert res["limits"][FURIOSA.partition_resource("2core.12gb")] == "1"
    assert FURIOSA.resource not in res["limits"]

    # the sandbox's node is an rngd: the run waits, Unschedulable, as on a cluster
    operator.wait(lambda: "Unschedulable" in _reasons(cluster, "maxrun"), 60, "Unschedulable")
    assert cluster.status("maxrun")["phase"] == "Pending"
    assert not cluster.pods("maxrun")[0]["spec"].get("nodeName")

    # the run managed by MultiKueue: no Job, ConfigMap or ServiceAccount, no status from us
    assert cluster.jobs("foreign") == [] and cluster.status("foreign") == {}
    for kind in ("configmap/foreign-config", "serviceaccount/foreign-worker"):
        assert cluster.kubectl("get", kind, check=False).returncode != 0, kind
    r = cluster.kubectl(
        "patch",
        "mft",
        "foreign",
        "--type=merge",
        "-p",
        '{"spec":{"managedBy":"npu-lora.io/operator"}}',
        check=False,
    )
    assert r.returncode != 0 and "managedBy is immutable" in r.stderr, r.stderr
    mirrored = {"phase": "Running", "message": "mirrored from worker1 by MultiKueue"}
    cluster.kubectl(
        "patch",
        "mft",
        "foreign",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": mirrored}),
    )

    # the node labelled rngd-max (as feature discovery would): the run is scheduled and runs
    cluster.kubectl(
        "label", "node", cluster.kubelet.node_name, f"{NODE.product_label}=rngd-max", "--overwrite"
    )
    operator.wait(
        lambda: cluster.status("maxrun").get("phase") in ("Succeeded", "Failed"), 240, "the end"
    )
    st = cluster.status("maxrun")
    assert st["phase"] == "Succeeded", st
    assert cluster.pods("maxrun")[0]["spec"]["nodeName"] == cluster.kubelet.node_name

    # Kubeflow Trainer's names beside our own fields, and the PROGRESS column
    ts = st["trainerStatus"]
    assert ts["progressPercentage"] == 100 and ts["estimatedRemainingSeconds"] == 0
    assert ts["lastUpdatedTime"] and st["progress"]["step"] == 6
    names = [m["name"] for m in ts["metrics"]]
    assert names == [m.name for m in record.TRAINER_METRICS if m.source != "eval"]
    assert all(isinstance(m["value"], str) and float(m["value"]) > 0 for m in ts["metrics"])
    row = cluster.row("maxrun")
    assert row["PROGRESS"] == "100" and row["STEP"] == "6", row

    # still nothing from us on the foreign run; its status is what its controller wrote
    assert cluster.jobs("foreign") == []
    assert cluster.status("foreign") == mirrored
    assert cluster.mft("foreign")["spec"]["managedBy"] == MULTIKUEUE
