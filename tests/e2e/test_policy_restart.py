"""Issue 38, item 2, end to end: the admission policy has no waiver. A suspended run whose spec
is edited while the operator is down (an image, a compile-cache hostPath at /etc, a system
priority class, precompile on) is refused when the real operator restarts: no Job with that
image or mount exists, the run is ``Failed`` with reason ``PolicyViolation`` naming each field,
and un-suspending it starts nothing."""

from __future__ import annotations

import json
import time

import pytest
from e2e_harness import Cluster, OperatorProcess, manifest

pytestmark = pytest.mark.e2e

EVIL_IMAGE = "evil.example.com/miner:1"


def _volumes_and_images(job: dict) -> tuple[set[str], set[str]]:
    pod = job["spec"]["template"]["spec"]
    paths = {(v.get("hostPath") or {}).get("path") for v in pod.get("volumes") or []}
    images = {c["image"] for c in [*pod.get("initContainers", []), *pod["containers"]]}
    return paths - {None}, images


def test_suspended_run_edited_while_the_operator_is_down_is_refused_on_restart(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    name = "edited"
    cluster.apply(manifest(name, suspend=True))
    operator.wait(lambda: cluster.jobs(name), 30, "the suspended Job")
    operator.wait(lambda: cluster.status(name).get("phase") == "Suspended", 30, "phase Suspended")
    (job,) = cluster.jobs(name)
    assert job["spec"]["suspend"] is True

    operator.kill()
    patch = {
        "spec": {
            "image": EVIL_IMAGE,
            "device": {"precompile": True, "compileCache": {"hostPath": "/etc"}},
            "podTemplate": {"priorityClassName": "system-node-critical"},
        }
    }
    cluster.kubectl("patch", "mft", name, "--type=merge", "-p", json.dumps(patch))
    operator.start()

    operator.wait(
        lambda: cluster.status(name).get("phase") == "Failed", 60, "the run Failed on restart"
    )
    status = cluster.status(name)
    (cond,) = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert cond["reason"] == "PolicyViolation", cond
    for field in (
        "spec.image",
        "spec.device.compileCache.hostPath",
        "spec.podTemplate.priorityClassName",
    ):
        assert field in cond["message"], cond["message"]

    jobs = cluster.jobs(name)
    assert [j["metadata"]["name"] for j in jobs] == [name], "a child was created on resume"
    for j in cluster.emulator.list("batch/v1", "Job", namespace="default"):
        paths, images = _volumes_and_images(j)
        assert "/etc" not in paths and EVIL_IMAGE not in images, j["metadata"]["name"]
    assert jobs[0]["spec"]["suspend"] is True
    events = cluster.kubectl("get", "events", "-o", "json").stdout
    assert "PolicyViolation" in events

    # un-suspending the refused run starts nothing
    cluster.kubectl("patch", "mft", name, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    time.sleep(3)
    (job,) = cluster.jobs(name)
    assert job["spec"]["suspend"] is True
    assert cluster.pods(name) == []
    assert cluster.status(name)["phase"] == "Failed"
