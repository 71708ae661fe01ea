"""Runs end to end: real kubectl → emulator → real kopf operator (subprocess) → Job → local
kubelet → `npu-lora run` (the tiny model) → status reports → `kubectl get mft` columns."""

from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_harness import Cluster, OperatorProcess, manifest, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="the worker needs torch (npu-lora[worker])",
    ),
]

NUM = re.compile(r"^-?\d+(\.\d+)?(e-?\d+)?$")
RUN_TIMEOUT = 240


def _wait(pred: Any, timeout: float, what: str, op: OperatorProcess | None = None) -> Any:
    if op is not None:
        return op.wait(pred, timeout, what)
    return wait_until(pred, timeout=timeout, interval=0.3)


def _step(cluster: Cluster, name: str) -> int:
    return int(((cluster.status(name).get("progress") or {}).get("step")) or 0)


def _worker_log(cluster: Cluster, name: str) -> str:
    logs = sorted(Path(cluster.kubelet.root, "pods").glob(f"default_{name}-*/container.log"))
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)


def test_run_succeeds_across_operator_restart(cluster: Cluster, operator: OperatorProcess) -> None:
    name = "e2e-run"
    watch = cluster.kubectl.popen("get", "mft", "-w")
    try:
        cluster.apply(manifest(name, steps=40))
        _wait(lambda: cluster.jobs(name), 30, "the Job", operator)
        _wait(lambda: cluster.status(name).get("phase") == "Running", 60, "phase Running", operator)
        _wait(lambda: _step(cluster, name) >= 1, 120, "the first step", operator)

        # the operator dies mid-run: the worker keeps training and reporting
        operator.kill()
        s1 = _step(cluster, name)

        row = cluster.row(name)
        assert row["PHASE"] == "Running", row
        for col in ("STEP", "LOSS", "S/STEP", "ATTN", "HOST-FWD", "HOST-BWD"):
            assert NUM.match(row[col]), (col, row)

        # per-run RBAC: only this run, only get/patch status + get
        role = json.loads(cluster.kubectl("get", "role", f"{name}-worker", "-o", "json").stdout)
        assert role["rules"] == [
            {
                "apiGroups": ["npu-lora.io"],
                "resources": ["moefinetunes/status"],
                "resourceNames": [name],
                "verbs": ["get", "patch"],
            },
            {
                "apiGroups": ["npu-lora.io"],
                "resources": ["moefinetunes"],
                "resourceNames": [name],
                "verbs": ["get"],
            },
        ]
        rb = json.loads(
            cluster.kubectl("get", "rolebinding", f"{name}-worker", "-o", "json").stdout
        )
        assert rb["subjects"][0]["name"] == f"{name}-worker"
        pod = cluster.pods(name)[0]
        assert pod["spec"]["serviceAccountName"] == f"{name}-worker"
        sa = f"--as=system:serviceaccount:default:{name}-worker"

        def can(*args: str) -> str:
            r = cluster.kubectl("auth", "can-i", *args, sa, check=False)
            return r.stdout.strip()

        assert can("patch", f"moefinetunes.npu-lora.io/{name}", "--subresource=status") == "yes"
        assert can("get", f"moefinetunes.npu-lora.io/{name}") == "yes"
        assert can("patch", "moefinetunes.npu-lora.io/other", "--subresource=status") == "no"
        assert can("patch", f"moefinetunes.npu-lora.io/{name}") == "no"
        assert can("delete", f"moefinetunes.npu-lora.io/{name}") == "no"
        assert can("create", "jobs.batch") == "no"

        _wait(lambda: _step(cluster, name) > s1 or s1 >= 40, 120, "progress without the operator")
        operator.start()
        _wait(
            lambda: cluster.status(name).get("phase") in ("Succeeded", "Failed"),
            RUN_TIMEOUT,
            "the end of the run",
            operator,
        )
        st = cluster.status(name)
        assert st["phase"] == "Succeeded", (st, _worker_log(cluster, name))
        # adopted, never duplicated
        assert len(cluster.jobs(name)) == 1
        assert len(cluster.pods(name)) == 1 and st["attempts"] == 1
        conds = {c["type"]: c for c in st["conditions"]}
        assert conds["Succeeded"]["status"] == "True" and conds["Running"]["status"] == "False"
        assert st["progress"]["step"] == 40 and st["progress"]["totalSteps"] == 40
        assert st["hot"]["experts"] > 0 and st["hot"]["selectedAtStep"] == 2
        assert st["completionTime"] and st["startTime"] and st["jobName"] == name

        row = cluster.row(name)
        assert row["PHASE"] == "Succeeded" and row["STEP"] == "40", row
        for col in ("LOSS", "S/STEP", "ATTN", "HOST-FWD", "HOST-BWD", "HOT"):
            assert NUM.match(row[col]), (col, row)
        wide = cluster.row(name, "-o", "wide")
        assert wide["TOTAL"] == "40" and wide["NODE"] and NUM.match(wide["CALLS/LAYER"]), wide
        # the host expert weight bytes this rank read in the last step (counted per kernel call)
        assert wide["EXPERT-BYTES"].isdigit() and int(wide["EXPERT-BYTES"]) > 0, wide

        run_dir = cluster.kubelet.pvc_dir("runs") / name
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == list(range(1, 41))
        assert (run_dir / "summary.json").exists()
        # kopf posts events asynchronously: they may land just after the status patch
        _wait(
            lambda: (
                "JobCreated"
                in (
                    ev := cluster.kubectl(
                        "get", "events", "--field-selector", f"involvedObject.name={name}"
                    ).stdout
                )
                and "Completed" in ev
            ),
            30,
            "JobCreated and Completed events",
            operator,
        )
    finally:
        watch.terminate()
        out, _ = watch.communicate(timeout=10)
    phases = [line.split()[1] for line in out.splitlines()[1:] if line.strip()]
    assert "Running" in phases and phases[-1] == "Succeeded", out
    assert phases.index("Running") < phases.index("Succeeded")


def test_worker_failure_reported(cluster: Cluster, operator: OperatorProcess) -> None:
    name = "e2e-fail"
    obj = manifest(
        name, data={"path": "nsmc/missing.tsv", "volume": {"claimName": "data"}}, backoffLimit=2
    )
    (cluster.kubelet.pvc_dir("data")).mkdir(parents=True, exist_ok=True)
    cluster.apply(obj)
    # kubectl wait on the typed condition (a watch on the object)
    r = cluster.kubectl(
        "wait", "--for=condition=Failed", f"mft/{name}", "--timeout=240s", timeout=250, check=False
    )
    assert r.returncode == 0, (r.stdout, r.stderr, operator.log())
    st = cluster.status(name)
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Failed"]["status"] == "True"
    assert conds["Failed"]["reason"] == "WorkerError", st
    assert "missing.tsv" in st["message"], st["message"]
    assert "code 2" in st["message"] and st["podName"] in st["message"]
    # the config error failed the Job at once (podFailurePolicy), no retries
    assert len(cluster.pods(name)) == 1
    described = cluster.kubectl("describe", "mft", name).stdout
    assert "WorkerError" in described


def test_suspend_and_resume(cluster: Cluster, operator: OperatorProcess) -> None:
    name = "e2e-suspend"
    cluster.apply(manifest(name, steps=80, checkpoint={"everySteps": 5}))
    _wait(lambda: _step(cluster, name) >= 3, 150, "step 3", operator)
    cluster.kubectl("patch", "mft", name, "--type", "merge", "-p", '{"spec":{"suspend":true}}')
    _wait(lambda: cluster.status(name).get("phase") == "Suspended", 60, "phase Suspended", operator)
    _wait(
        lambda: (
            not [
                p
                for p in cluster.pods(name)
                if (p.get("status") or {}).get("phase") in ("Pending", "Running")
            ]
        ),
        30,
        "the worker pod gone",
        operator,
    )
    job = cluster.jobs(name)[0]
    assert job["spec"]["suspend"] is True
    assert cluster.row(name)["PHASE"] == "Suspended"
    suspended_at = _step(cluster, name)
    # mutable fields while suspended: the Job's deadline follows, the worker config is rewritten,
    # a change the existing Job cannot take (backoffLimit) gets a Warning event (a disallowed
    # image would fail the run: the policy has no waiver, tests/e2e/test_policy_restart.py)
    cluster.kubectl(
        "patch",
        "mft",
        name,
        "--type",
        "merge",
        "-p",
        '{"spec":{"activeDeadlineSeconds":3600,"reporting":{"everySteps":2},"backoffLimit":1}}',
    )
    _wait(
        lambda: cluster.jobs(name)[0]["spec"].get("activeDeadlineSeconds") == 3600,
        30,
        "the Job's activeDeadlineSeconds",
        operator,
    )
    # the handler patches the Job, then the ConfigMap, then emits the event: wait for each
    _wait(
        lambda: (
            "everySteps: 2"
            in cluster.emulator.get("v1", "ConfigMap", f"{name}-config", namespace="default")[
                "data"
            ]["config.yaml"]
        ),
        30,
        "the worker ConfigMap rewritten with reporting.everySteps 2",
        operator,
    )
    _wait(
        lambda: (
            "ChangeNotApplied" in (ev := cluster.kubectl("get", "events").stdout)
            and "spec.backoffLimit" in ev
        ),
        30,
        "a ChangeNotApplied event naming spec.backoffLimit",
        operator,
    )
    time.sleep(1.0)
    assert _step(cluster, name) == suspended_at  # nothing trains while suspended

    cluster.kubectl("patch", "mft", name, "--type", "merge", "-p", '{"spec":{"suspend":false}}')
    _wait(
        lambda: cluster.status(name).get("phase") == "Running", 60, "phase Running again", operator
    )
    _wait(
        lambda: cluster.status(name).get("phase") in ("Succeeded", "Failed"),
        RUN_TIMEOUT,
        "the end of the run",
        operator,
    )
    st = cluster.status(name)
    assert st["phase"] == "Succeeded", (st, _worker_log(cluster, name))
    assert st["progress"]["step"] == 80
    assert len(cluster.jobs(name)) == 1
    # resumed from the checkpoint: every step recorded exactly once
    run_dir = cluster.kubelet.pvc_dir("runs") / name
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 81))


def test_delete_mid_run_cascades(cluster: Cluster, operator: OperatorProcess) -> None:
    name = "e2e-delete"
    cluster.apply(manifest(name, steps=2000))
    _wait(lambda: _step(cluster, name) >= 1, 150, "the first step", operator)
    pod_dir = next(Path(cluster.kubelet.root, "pods").glob(f"default_{name}-*"))
    cluster.kubectl("delete", "mft", name, "--wait=true", timeout=60)
    _wait(lambda: not cluster.jobs(name) and not cluster.pods(name), 60, "Job and Pod gone")
    for kind in ("configmap", "role", "rolebinding", "serviceaccount"):
        out = cluster.kubectl("get", kind, "-l", f"npu-lora.io/run={name}", "-o", "name").stdout
        assert out.strip() == "", (kind, out)
    # the worker process was stopped (SIGTERM, then SIGKILL after the grace period): its log
    # stops growing
    log = pod_dir / "container.log"
    deadline = time.monotonic() + 40
    size = -1
    while time.monotonic() < deadline:
        now = log.stat().st_size
        if now == size:
            break
        size = now
        time.sleep(3)
    else:
        raise AssertionError(f"the worker still writes its log:\n{log.read_text()[-2000:]}")
