"""A 2-worker run end to end: real kubectl → emulator → real kopf operator → Indexed Job + headless
Service → the sandbox kubelet runs both pods (JOB_COMPLETION_INDEX 0 and 1; pod 0's Service name
resolved to loopback) → 2 gloo ranks train → Succeeded with one adapter. And a worker that never
comes up: rank 0 fails with the rendezvous exit code, the run Failed (RendezvousTimeout), nothing
left running."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_harness import ROOT, Cluster, OperatorProcess, wait_until
from testkit import free_port

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="the worker needs torch (npu-lora[worker])",
    ),
]


def _example(name: str, **distributed: Any) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "tiny-distributed.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["training"]["steps"] = 6
    doc["spec"]["moe"]["warmupSteps"] = 2
    doc["spec"]["checkpoint"]["everySteps"] = 3
    doc["spec"]["distributed"].update({"port": free_port(), **distributed})
    return doc


def _wait(pred: Any, timeout: float, what: str, op: OperatorProcess, cluster: Cluster) -> Any:
    try:
        return wait_until(pred, timeout=timeout, interval=0.3)
    except AssertionError:
        logs = sorted(Path(cluster.kubelet.root, "pods").glob("*/container.log"))
        tail = "\n".join(p.read_text(errors="replace")[-2000:] for p in logs)
        raise AssertionError(
            f"timed out waiting for {what}\nstatus: {json.dumps(cluster.status(what.split()[0]))}"
            f"\noperator log:\n{op.log()}\nworker logs:\n{tail}"
        ) from None


def test_two_workers_train_to_one_adapter(cluster: Cluster, operator: OperatorProcess) -> None:
    name = "e2e-dp"
    cluster.apply(_example(name))
    _wait(
        lambda: cluster.status(name).get("phase") in ("Succeeded", "Failed"),
        300,
        f"{name} to finish",
        operator,
        cluster,
    )
    status = cluster.status(name)
    assert status["phase"] == "Succeeded", status
    (job,) = cluster.jobs(name)
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    svc = json.loads(cluster.kubectl("get", "service", f"{name}-dp", "-o", "json").stdout)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["metadata"]["ownerReferences"][0]["kind"] == "MoEFinetune"
    pods = cluster.pods(name)
    index = "batch.kubernetes.io/job-completion-index"
    assert sorted(p["metadata"]["annotations"][index] for p in pods) == ["0", "1"]
    assert all(p["status"]["phase"] == "Succeeded" for p in pods)
    # both ranks trained: rank 0's records carry both ranks' compute times and tokens
    run_dir = Path(cluster.kubelet.root) / "pvc" / "default" / "runs" / name
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, 7))
    assert all(r["world_size"] == 2 and len(r["rank_compute_s"]) == 2 for r in recs)
    assert recs[0]["tokens"] == 2 * 2 * 64  # 2 ranks × batch 2 × seqLen 64
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert len(list(run_dir.parent.glob(f"{name}*"))) == 1  # one run directory, one adapter
    dist = status["distributed"]
    assert dist["worldSize"] == 2 and dist["workers"] == 2 and dist["step"] == 6
    assert len(dist["rankComputeSeconds"]) == 2 and dist["skewSeconds"] >= 0
    assert dist["allreduceBytes"] > 0
    row = cluster.row(name)
    assert row["PHASE"] == "Succeeded" and row["STEP"] == "6", row
    # deleting the run garbage-collects the Job and the Service
    cluster.kubectl("delete", "mft", name)
    wait_until(
        lambda: (
            not cluster.jobs(name)
            and cluster.kubectl("get", "service", f"{name}-dp", check=False).returncode != 0
        ),
        timeout=60,
    )


def test_a_worker_that_never_comes_up_fails_the_run(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    name = "e2e-dp-alone"
    kl = cluster.kubelet
    real = kl._unschedulable

    def no_room_for_worker_1(spec: dict[str, Any]) -> str | None:
        # fault injection: worker 1's node never has room (its pod stays Pending)
        if spec.get("hostname") == f"{name}-1":
            return "0/1 nodes are available: 1 Insufficient furiosa.ai/rngd."
        return real(spec)

    kl._unschedulable = no_room_for_worker_1
    cluster.apply(_example(name, rendezvousTimeoutSeconds=8))
    _wait(
        lambda: cluster.status(name).get("phase") in ("Succeeded", "Failed"),
        180,
        f"{name} to fail",
        operator,
        cluster,
    )
    status = cluster.status(name)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (status["phase"], failed["status"], failed["reason"]) == (
        "Failed",
        "True",
        "RendezvousTimeout",
    ), status
    assert "did not all join the process group" in failed["message"]
    assert "rendezvousTimeoutSeconds (8 s)" in failed["message"]
    # nothing left running: no worker process, no active pod
    wait_until(lambda: not kl._procs, timeout=30)
    job = cluster.jobs(name)[0]
    assert not job["status"].get("active")
    assert not (Path(kl.root) / "pvc" / "default" / "runs" / name / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (
            {"device": {"backend": "cpu", "cards": 2}, "distributed": {"ranksPerWorker": 4}},
            "distributed.ranksPerWorker must be at most device.cards",
        ),
        ({"distributed": {"workers": 0}}, "spec.distributed.workers"),
        ({"distributed": {"rendezvousTimeoutSeconds": 1}}, "rendezvousTimeoutSeconds"),
        (
            {"distributed": {"workers": 2}, "benchmark": {"rounds": 1}},
            "more than one rank is not supported with benchmark",
        ),
    ],
)
def test_invalid_distributed_rejected_by_the_server(
    cluster: Cluster, spec: dict[str, Any], needle: str
) -> None:
    doc = _example("e2e-dp-bad")
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    r = cluster.apply(doc, check=False)
    assert r.returncode != 0 and needle in r.stderr, r.stderr
    assert cluster.mft("e2e-dp-bad") is None
