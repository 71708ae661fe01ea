"""A precompiled run end to end (issue 29): real kubectl → emulator → kopf operator → the
precompile Job (one pod per device graph, each compiling with a real compiler: cpu, torch.compile
+ inductor, into the shared claim) → only then the training Job → `npu-lora run`, which finds
every graph of its plan in the cache and compiles nothing."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
from e2e_harness import Cluster, OperatorProcess, manifest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="the worker needs torch (npu-lora[worker])",
    ),
]

#: 6 graphs compiled by 6 pods at once on 2 shared cores, then a 4-step run
TIMEOUT = 900


def _wait(pred: Any, timeout: float, what: str, op: OperatorProcess) -> Any:
    return op.wait(pred, timeout, what)


def test_precompiled_run_compiles_then_trains_with_every_graph_a_cache_hit(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    from npu_lora.compile import cache

    name = "e2e-pc"
    watch = cluster.kubectl.popen("get", "mft", "-w")
    try:
        cluster.apply(
            manifest(
                name,
                steps=4,
                data={"path": "example:jsonl-mini", "format": "auto"},
                moe={"placement": "host-only"},
                training={"steps": 4, "seqLen": 8, "batchSize": 1, "learningRate": 0.001},
                device={
                    "backend": "cpu",
                    "cards": 0,
                    "precompile": True,
                    "compileCache": {"claimName": "graphs"},
                },
            )
        )
        _wait(
            lambda: cluster.status(name).get("phase") == "Compiling",
            60,
            "phase Compiling",
            operator,
        )
        st = cluster.status(name)
        assert st["compile"]["total"] == 6 and st["compile"]["jobName"] == f"{name}-compile", st
        # while compiling: the precompile Job only, no training Job
        assert [j["metadata"]["name"] for j in cluster.jobs(name)] == [f"{name}-compile"]
        _wait(
            lambda: cluster.status(name).get("phase") in ("Running", "Succeeded", "Failed"),
            TIMEOUT,
            "the training Job to start",
            operator,
        )
        _wait(
            lambda: cluster.status(name).get("phase") in ("Succeeded", "Failed"),
            TIMEOUT,
            "the end of the run",
            operator,
        )
        st = cluster.status(name)
        assert st["phase"] == "Succeeded", (st, operator.log()[-3000:])
        assert st["compile"]["done"] == st["compile"]["total"] == 6, st
        assert st["jobName"] == name
        jobs = sorted(j["metadata"]["name"] for j in cluster.jobs(name))
        assert jobs == [name, f"{name}-compile"]
        cjob = next(j for j in cluster.jobs(name) if j["metadata"]["name"] == f"{name}-compile")
        assert cjob["status"]["succeeded"] == 6
        # the fan-out: one compile pod per graph index
        index = "batch.kubernetes.io/job-completion-index"
        cpods = [
            p for p in cluster.pods(name) if p["metadata"]["name"].startswith(f"{name}-compile")
        ]
        assert sorted(int(p["metadata"]["annotations"][index]) for p in cpods) == list(range(6))

        # the cache holds every graph, no half entry
        root = cluster.kubelet.pvc_dir("graphs") / "npu-lora"
        entries = sorted(root.glob("v1/*/*/entry.json"))
        assert len(entries) == 6, entries
        assert cache.temporaries(root) == []

        # the training pod compiled nothing: every graph a hit
        summary = json.loads((cluster.kubelet.pvc_dir("runs") / name / "summary.json").read_text())
        rec = summary["compile"]
        assert (rec["hits"], rec["misses"], rec["compiled"]) == (6, 0, 0), rec
        assert all(g["hit"] for g in rec["graphs"]), rec
    finally:
        watch.terminate()
        out, _ = watch.communicate(timeout=10)
    phases = [line.split()[1] for line in out.splitlines()[1:] if line.strip()]
    assert "Compiling" in phases and "Running" in phases and phases[-1] == "Succeeded", out
    assert phases.index("Compiling") < phases.index("Running") < phases.index("Succeeded"), out
