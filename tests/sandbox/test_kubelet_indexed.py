"""The sandbox's Indexed Jobs: one pod per index with JOB_COMPLETION_INDEX, hostname and
subdomain; a headless Service's pod names resolve to loopback in the pod environment; a
FailJob exit code of one index fails the Job and stops the other pods."""

from __future__ import annotations

import json
from typing import Any

from npu_lora_sandbox.emulator import ApiEmulator
from npu_lora_sandbox.kubelet import LocalKubelet
from test_kubelet_jobs import finished, job, pods_of

SHOW_ENV = (
    "import json, os; open('/dev/termination-log', 'w').write(json.dumps({k: os.environ.get(k) "
    "for k in ('JOB_COMPLETION_INDEX', 'MASTER_ADDR', 'OTHER')}))"
)


def _service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": "None", "selector": {"app": name}, "ports": [{"port": 29500}]},
    }


def test_indexed_job_pods_get_index_hostname_and_loopback_master(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any
) -> None:
    emulator.create(_service("dp"))
    env = [
        {"name": "MASTER_ADDR", "value": "ix-0.dp"},
        {"name": "OTHER", "value": "ix-0.elsewhere"},  # not the pod's subdomain: unchanged
    ]
    emulator.create(
        job(
            "ix",
            SHOW_ENV,
            completionMode="Indexed",
            completions=2,
            parallelism=2,
            container={"env": env},
            pod_spec={"subdomain": "dp"},
        )
    )
    conds = wait_for(lambda: finished(emulator, "ix"), timeout=30)
    assert "Complete" in conds, conds
    pods = sorted(pods_of(emulator, "ix"), key=lambda p: p["metadata"]["name"])
    assert len(pods) == 2
    key = "batch.kubernetes.io/job-completion-index"
    for i, pod in enumerate(pods):
        assert pod["metadata"]["name"].startswith(f"ix-{i}-")
        assert pod["metadata"]["annotations"][key] == str(i)
        assert pod["metadata"]["labels"][key] == str(i)
        assert pod["spec"]["hostname"] == f"ix-{i}"
        assert pod["spec"]["subdomain"] == "dp"
        msg = pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
        shown = json.loads(msg)
        assert shown == {
            "JOB_COMPLETION_INDEX": str(i),
            "MASTER_ADDR": "127.0.0.1",
            "OTHER": "ix-0.elsewhere",
        }
    status = emulator.get("batch/v1", "Job", "ix", "default")["status"]
    assert status["succeeded"] == 2 and status["completedIndexes"] == "0-1"


def test_indexed_job_fail_job_code_of_one_index_stops_the_others(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any
) -> None:
    policy = {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "main", "operator": "In", "values": [4]},
            }
        ]
    }
    code = (
        "import os, sys, time\n"
        "if os.environ['JOB_COMPLETION_INDEX'] == '0': sys.exit(4)\n"
        "time.sleep(120)\n"
    )
    emulator.create(
        job(
            "ixf",
            code,
            completionMode="Indexed",
            completions=2,
            parallelism=2,
            backoffLimit=4,
            podFailurePolicy=policy,
        )
    )
    conds = wait_for(lambda: finished(emulator, "ixf"), timeout=30)
    assert conds["Failed"]["reason"] == "PodFailurePolicy"
    assert "exit code 4" in conds["Failed"]["message"]
    # the sleeping index-1 pod is gone: nothing left running
    wait_for(
        lambda: (
            all(
                p["status"].get("phase") in ("Failed", "Succeeded")
                or p["metadata"].get("deletionTimestamp")
                for p in pods_of(emulator, "ixf")
            )
            and not kubelet_processes(kubelet)
        ),
        timeout=30,
    )


def kubelet_processes(kubelet: LocalKubelet) -> list[Any]:
    return [p for p in getattr(kubelet, "_procs", {}).values() if p is not None]
