"""The local kubelet + Job controller: Jobs run as local processes, with Kubernetes 1.32 status."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from npu_lora_sandbox.emulator import ApiEmulator
from npu_lora_sandbox.kubelet import LocalKubelet


def job(name: str, code: str, **spec: Any) -> dict[str, Any]:
    container = spec.pop("container", {})
    pod_spec = spec.pop("pod_spec", {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "python:3.11",
                            "command": ["python", "-c", code],
                            **container,
                        }
                    ],
                    **pod_spec,
                }
            },
            **spec,
        },
    }


def conditions(emu: ApiEmulator, name: str) -> dict[str, dict[str, Any]]:
    j = emu.get("batch/v1", "Job", name, "default") or {}
    return {
        c["type"]: c
        for c in (j.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }


def finished(emu: ApiEmulator, name: str) -> dict[str, dict[str, Any]] | None:
    conds = conditions(emu, name)
    return conds if {"Complete", "Failed"} & set(conds) else None


def pods_of(emu: ApiEmulator, name: str) -> list[dict[str, Any]]:
    return emu.list("v1", "Pod", "default", label_selector=f"job-name={name}")


def test_job_succeeds_with_termination_message_and_volumes(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any, kubectl: Any
) -> None:
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg"},
            "data": {"config.yaml": "output: /output/run1\n"},
        }
    )
    code = (
        "import os, pathlib\n"
        "cfg = open('/etc/run/config.yaml').read().split(': ')[1].strip()\n"
        "pathlib.Path(cfg).mkdir(parents=True, exist_ok=True)\n"
        "open(cfg + '/result.txt', 'w').write(os.environ['POD_NAME'] + ' ' + os.environ['NS'] + ' ' + os.environ['LIT'])\n"
        "open('/dev/termination-log', 'w').write('{\"loss\": 0.5}')\n"
        "print('training done')\n"
    )
    emulator.create(
        job(
            "ok",
            code,
            container={
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "LIT", "value": "/output/x"},
                ],
                "volumeMounts": [
                    {"name": "out", "mountPath": "/output"},
                    {"name": "cfg", "mountPath": "/etc/run"},
                    {"name": "scratch", "mountPath": "/tmp/scratch"},
                ],
            },
            pod_spec={
                "volumes": [
                    {"name": "out", "persistentVolumeClaim": {"claimName": "runs"}},
                    {"name": "cfg", "configMap": {"name": "cfg"}},
                    {"name": "scratch", "emptyDir": {}},
                ]
            },
        )
    )
    conds = wait_for(lambda: finished(emulator, "ok"), timeout=20)
    assert set(conds) == {"Complete", "SuccessCriteriaMet"}
    status = emulator.get("batch/v1", "Job", "ok", "default")["status"]
    assert (
        status["succeeded"] == 1
        and status["active"] == 0
        and status["completionTime"]
        and status["startTime"]
    )
    (pod,) = pods_of(emulator, "ok")
    meta = pod["metadata"]
    assert meta["name"].startswith("ok-") and len(meta["name"]) == len("ok-") + 5
    assert (
        meta["labels"]["batch.kubernetes.io/job-name"] == "ok" and meta["labels"]["controller-uid"]
    )
    assert (
        meta["ownerReferences"][0]["kind"] == "Job"
        and meta["ownerReferences"][0]["controller"] is True
    )
    assert pod["spec"]["nodeName"] == "sandbox-node" and pod["status"]["phase"] == "Succeeded"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (
        term["exitCode"] == 0
        and term["reason"] == "Completed"
        and term["message"] == '{"loss": 0.5}'
    )
    result = (kubelet.pvc_dir("runs") / "run1" / "result.txt").read_text()
    assert result == f"{meta['name']} default {kubelet.pvc_dir('runs')}/x"
    assert emulator.get("v1", "Node", "sandbox-node") is not None
    assert "training done" in kubectl("logs", "job/ok").stdout
    out = kubectl("get", "jobs").stdout.splitlines()
    assert out[0].split()[:3] == ["NAME", "STATUS", "COMPLETIONS"] and out[1].split()[:3] == [
        "ok",
        "Complete",
        "1/1",
    ]
    assert "Completed" in kubectl("get", "pods").stdout


def test_backoff_retries_then_backoff_limit_exceeded(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any
) -> None:
    emulator.create(
        job(
            "flaky",
            "import sys; print('boom'); sys.exit(3)",
            backoffLimit=2,
            container={"terminationMessagePolicy": "FallbackToLogsOnError"},
        )
    )
    conds = wait_for(lambda: finished(emulator, "flaky"), timeout=20)
    assert conds["Failed"]["reason"] == "BackoffLimitExceeded"
    assert conds["FailureTarget"]["reason"] == "BackoffLimitExceeded"
    status = emulator.get("batch/v1", "Job", "flaky", "default")["status"]
    assert status["failed"] == 3 and status.get("succeeded", 0) == 0
    pods = pods_of(emulator, "flaky")
    assert len(pods) == 3 and all(p["status"]["phase"] == "Failed" for p in pods)
    term = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error" and term["message"].strip() == "boom"


def test_pod_failure_policy_fail_job_and_ignore(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any
) -> None:
    policy = {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "main", "operator": "In", "values": [2]},
            },
        ]
    }
    emulator.create(
        job("cfgerr", "import sys; sys.exit(2)", backoffLimit=5, podFailurePolicy=policy)
    )
    conds = wait_for(lambda: finished(emulator, "cfgerr"), timeout=20)
    assert conds["Failed"]["reason"] == "PodFailurePolicy"
    assert "failed with exit code 2 matching FailJob rule at index 1" in conds["Failed"]["message"]
    assert len(pods_of(emulator, "cfgerr")) == 1
    # A disruption is ignored (not counted) and the pod is replaced.
    emulator.create(
        job("evicted", "import time; time.sleep(60)", backoffLimit=0, podFailurePolicy=policy)
    )
    pod = wait_for(
        lambda: [p for p in pods_of(emulator, "evicted") if p["status"].get("phase") == "Running"],
        timeout=20,
    )[0]
    kubelet.disrupt_pod("default", pod["metadata"]["name"])
    wait_for(lambda: len(pods_of(emulator, "evicted")) == 2, timeout=20)
    status = emulator.get("batch/v1", "Job", "evicted", "default")["status"]
    assert not status.get("failed") and not finished(emulator, "evicted")
    emulator.delete("batch/v1", "Job", "evicted", "default")
    wait_for(lambda: not pods_of(emulator, "evicted"), timeout=10)


def test_active_deadline_kills_process(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "still-running"
    code = f"import time, pathlib\nfor i in range(100):\n    time.sleep(0.1)\npathlib.Path({str(marker)!r}).touch()\n"
    emulator.create(job("slow", code, activeDeadlineSeconds=1, backoffLimit=3))
    t0 = time.monotonic()
    conds = wait_for(lambda: finished(emulator, "slow"), timeout=20)
    assert time.monotonic() - t0 >= 0.9
    assert conds["Failed"]["reason"] == "DeadlineExceeded"
    assert conds["Failed"]["message"] == "Job was active longer than specified deadline"
    wait_for(lambda: not kubelet._procs, timeout=10)
    assert not marker.exists()


def test_suspend_and_resume(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    code = f"import time, os\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.05)\n"
    emulator.create(job("sus", code))
    first = wait_for(
        lambda: [p for p in pods_of(emulator, "sus") if p["status"].get("phase") == "Running"],
        timeout=20,
    )[0]
    wait_for(lambda: emulator.get("batch/v1", "Job", "sus", "default")["status"].get("ready") == 1)
    emulator.patch("batch/v1", "Job", "sus", {"spec": {"suspend": True}}, namespace="default")
    conds = wait_for(lambda: conditions(emulator, "sus").get("Suspended"), timeout=20)
    assert conds["reason"] == "JobSuspended"
    wait_for(lambda: not pods_of(emulator, "sus"), timeout=10)
    wait_for(lambda: first["metadata"]["uid"] not in kubelet._procs, timeout=10)
    assert emulator.get("batch/v1", "Job", "sus", "default")["status"]["active"] == 0
    emulator.patch("batch/v1", "Job", "sus", {"spec": {"suspend": False}}, namespace="default")
    second = wait_for(lambda: pods_of(emulator, "sus"), timeout=20)[0]
    assert second["metadata"]["name"] != first["metadata"]["name"]
    job_status = emulator.get("batch/v1", "Job", "sus", "default")["status"]
    resumed = next(c for c in job_status["conditions"] if c["type"] == "Suspended")
    assert resumed["status"] == "False" and resumed["reason"] == "JobResumed"
    gate.touch()
    assert "Complete" in wait_for(lambda: finished(emulator, "sus"), timeout=20)


def test_image_pull_backoff_and_unschedulable(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any, kubectl: Any
) -> None:
    emulator.create(job("nopull", "pass", container={"image": "registry.example/doesnotexist:1"}))
    pod = wait_for(
        lambda: [p for p in pods_of(emulator, "nopull") if p["status"].get("containerStatuses")],
        timeout=20,
    )[0]
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ImagePullBackOff" and pod["status"]["phase"] == "Pending"
    res = kubectl("logs", pod["metadata"]["name"], check=False)
    assert "is waiting to start: trying and failing to pull image" in res.stderr
    assert "ImagePullBackOff" in kubectl("get", "pods").stdout
    emulator.create(job("nonode", "pass", pod_spec={"nodeSelector": {"furiosa.ai/npu": "rngd"}}))
    cond = wait_for(
        lambda: [
            c
            for p in pods_of(emulator, "nonode")
            for c in p["status"].get("conditions") or []
            if c["type"] == "PodScheduled"
        ],
        timeout=20,
    )[0]
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable"
    assert "didn't match Pod's node affinity/selector" in cond["message"]
    emulator.create(
        job("toomany", "pass", container={"resources": {"limits": {"furiosa.ai/rngd": "9"}}})
    )
    cond = wait_for(
        lambda: [
            c
            for p in pods_of(emulator, "toomany")
            for c in p["status"].get("conditions") or []
            if c["type"] == "PodScheduled"
        ],
        timeout=20,
    )[0]
    assert "Insufficient furiosa.ai/rngd" in cond["message"]
    assert emulator.get("batch/v1", "Job", "nopull", "default")["status"]["active"] == 1


def test_deleting_job_kills_process_and_cascades(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    code = (
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    emulator.create(job("del", code))
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=20)
    pid = int(pid_file.read_text())
    emulator.delete("batch/v1", "Job", "del", "default")
    wait_for(lambda: not pods_of(emulator, "del"), timeout=10)

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().split()[2] == "Z"
        except FileNotFoundError:
            return True

    wait_for(gone, timeout=10)


def test_json_log_and_path_map_env(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any
) -> None:
    code = "import os, json; print(json.dumps(json.loads(os.environ['NPU_LORA_PATH_MAP']))); print(os.environ['KUBECONFIG'])"
    emulator.create(
        job(
            "env",
            code,
            container={"volumeMounts": [{"name": "o", "mountPath": "/output", "subPath": "r1"}]},
            pod_spec={"volumes": [{"name": "o", "persistentVolumeClaim": {"claimName": "c"}}]},
        )
    )
    wait_for(lambda: finished(emulator, "env"), timeout=20)
    (pod,) = pods_of(emulator, "env")
    log = (
        (kubelet.pod_dir("default", pod["metadata"]["name"]) / "container.log")
        .read_text()
        .splitlines()
    )
    mapping = json.loads(log[0])
    assert mapping["/output"] == str(kubelet.pvc_dir("c") / "r1")
    assert mapping["/dev/termination-log"].endswith("termination-log")
    sa = Path(mapping["/var/run/secrets/kubernetes.io/serviceaccount"])
    assert (sa / "namespace").read_text() == "default"
    assert Path(log[1]).exists() and sys.executable


def test_ttl_after_finished_and_stable_status(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any
) -> None:
    emulator.create(job("held", "pass", suspend=True))
    wait_for(lambda: conditions(emulator, "held").get("Suspended"), timeout=20)
    rv = emulator.get("batch/v1", "Job", "held", "default")["metadata"]["resourceVersion"]
    time.sleep(0.6)  # several controller ticks: a suspended Job's status is not rewritten
    assert emulator.get("batch/v1", "Job", "held", "default")["metadata"]["resourceVersion"] == rv
    assert not pods_of(emulator, "held")
    emulator.create(job("short", "pass", ttlSecondsAfterFinished=0))
    wait_for(lambda: emulator.get("batch/v1", "Job", "short", "default") is None, timeout=20)
    wait_for(lambda: not pods_of(emulator, "short"), timeout=10)


def test_deleted_running_pod_counts_as_failure_and_is_replaced(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any
) -> None:
    emulator.create(job("repl", "import time; time.sleep(60)", backoffLimit=3))
    first = wait_for(
        lambda: [p for p in pods_of(emulator, "repl") if p["status"].get("phase") == "Running"],
        timeout=20,
    )[0]
    emulator.delete("v1", "Pod", first["metadata"]["name"], "default")
    second = wait_for(
        lambda: [
            p for p in pods_of(emulator, "repl") if p["metadata"]["uid"] != first["metadata"]["uid"]
        ],
        timeout=20,
    )[0]
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert emulator.get("batch/v1", "Job", "repl", "default")["status"]["failed"] == 1
    emulator.patch(
        "batch/v1", "Job", "repl", {"spec": {"activeDeadlineSeconds": 0}}, namespace="default"
    )
    assert (
        wait_for(lambda: finished(emulator, "repl"), timeout=20)["Failed"]["reason"]
        == "DeadlineExceeded"
    )


def test_container_reports_status_through_the_api(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any, make_crd: Any
) -> None:
    emulator.load_crd(make_crd())
    emulator.create(
        {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"size": 1},
        }
    )
    code = (
        "import os\n"
        "from kubernetes import client, config\n"
        "config.load_config()\n"
        "ns = open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read()\n"
        "client.CustomObjectsApi().patch_namespaced_custom_object_status(\n"
        "    'example.com', 'v1', ns, 'widgets', 'w', {'status': {'phase': os.environ['POD']}})\n"
    )
    env = [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    # The pod authenticates as its ServiceAccount: without a Role the report is forbidden.
    emulator.create(
        job(
            "denied",
            code,
            backoffLimit=0,
            container={"env": env},
            pod_spec={"serviceAccountName": "reporter"},
        )
    )
    conds = wait_for(lambda: finished(emulator, "denied"), timeout=30)
    assert "Failed" in conds
    (pod,) = pods_of(emulator, "denied")
    log = (kubelet.pod_dir("default", pod["metadata"]["name"]) / "container.log").read_text()
    assert "403" in log and "cannot patch resource" in log and "widgets/status" in log
    for obj in (
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reporter"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "reporter"},
            "rules": [
                {
                    "apiGroups": ["example.com"],
                    "resources": ["widgets/status"],
                    "verbs": ["patch"],
                    "resourceNames": ["w"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reporter"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "reporter",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reporter", "namespace": "default"}],
        },
    ):
        emulator.create(obj)
    emulator.create(
        job("reporter", code, container={"env": env}, pod_spec={"serviceAccountName": "reporter"})
    )
    conds = wait_for(lambda: finished(emulator, "reporter"), timeout=30)
    assert "Complete" in conds, pods_of(emulator, "reporter")
    (pod,) = pods_of(emulator, "reporter")
    status = emulator.get("example.com/v1", "Widget", "w", "default")["status"]
    assert status == {"phase": pod["metadata"]["name"]}


def test_pods_share_the_host_kernel_cache_as_the_image_would(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """A subprocess pod gets ``NPU_LORA_KERNEL_CACHE`` = this process's kernel cache root (the
    worker image's ENV names its pre-built cache), not its own ``/tmp``: the host kernels are
    built once for the sandbox, not once per pod."""
    from npu_lora.machine import kernel_cache_root

    monkeypatch.setenv("NPU_LORA_KERNEL_CACHE", str(tmp_path / "kc"))
    assert kernel_cache_root() == tmp_path / "kc"
    code = (
        "import os; print(os.environ['NPU_LORA_KERNEL_CACHE']); print(os.environ['XDG_CACHE_HOME'])"
    )
    emulator.create(
        job("kc", code, container={"env": [{"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"}]})
    )
    wait_for(lambda: finished(emulator, "kc"), timeout=20)
    (pod,) = pods_of(emulator, "kc")
    log = (kubelet.pod_dir("default", pod["metadata"]["name"]) / "container.log").read_text()
    cache, xdg = log.splitlines()[:2]
    assert cache == str(tmp_path / "kc")
    assert xdg != cache and not xdg.startswith(str(tmp_path / "kc"))  # /tmp stays the pod's own
