"""The precompile fan-out in the sandbox: the operator's Indexed precompile Job (built by
``npu_lora_operator.precompile``, created here directly; tests/e2e/test_precompile_run.py runs it through the operator) runs
one pod per graph of the plan, each compiling with a real compiler (cpu: torch.compile +
inductor) into the shared claim; then the run's plan finds every key (the training pod compiles
nothing)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from npu_lora.compile import cache
from npu_lora.compile.plan import compile_plan
from npu_lora_operator import builders
from npu_lora_operator.precompile import build_precompile_job, plan_size
from npu_lora_operator.settings import OperatorConfig
from npu_lora_sandbox.emulator import ApiEmulator
from npu_lora_sandbox.kubelet import LocalKubelet
from test_kubelet_jobs import finished, pods_of

pytestmark = pytest.mark.slow


def test_precompile_job_fans_out_one_pod_per_graph_into_the_cache(
    emulator: ApiEmulator, kubelet: LocalKubelet, wait_for: Any
) -> None:
    body = {
        "metadata": {"name": "pc", "namespace": "default", "uid": "u-pc"},
        "spec": {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "example:jsonl-mini"},
            "moe": {"placement": "host-only"},
            "training": {"seqLen": 8, "batchSize": 1, "steps": 2},
            "device": {
                "backend": "cpu",
                "cards": 0,
                "precompile": True,
                "compileCache": {"claimName": "graphs"},
            },
        },
    }
    run = builders.Run.from_body(body)
    total = plan_size(run)
    assert total == 6  # embed, attention, head_n1/2/4/8
    config = OperatorConfig(worker_command=("python", "-m", "npu_lora.cli"))
    emulator.create(builders.build_configmap(run))
    job = build_precompile_job(run, config, total, max_parallel=2)
    t0 = time.monotonic()
    emulator.create(job)
    name = job["metadata"]["name"]
    conds = wait_for(lambda: finished(emulator, name), timeout=900, interval=0.5)
    wall = time.monotonic() - t0
    pods = pods_of(emulator, name)
    logs = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["state"] for p in pods}
    assert "Complete" in conds, (conds, logs)
    key = "batch.kubernetes.io/job-completion-index"
    assert sorted(int(p["metadata"]["annotations"][key]) for p in pods) == list(range(total))
    assert all(p["status"]["phase"] == "Succeeded" for p in pods)
    root = kubelet.pvc_dir("graphs") / "npu-lora"
    plan = compile_plan(run.spec)
    found = cache.lookup(root, plan.keys)
    assert all(found.values()), found
    assert cache.temporaries(root) == []
    seconds = {
        cache.read_entry(root, e.key)["entry"]["name"]: cache.read_entry(root, e.key)["compile_s"]
        for e in plan.entries
    }
    print(
        f"precompile fan-out: {total} graphs, 2 at a time, wall {wall:.0f} s; per graph {seconds}"
    )
    from npu_lora.compile.precompile import ensure_plan

    rec = ensure_plan(plan, root)  # what the training pod does before its first step
    assert (rec["hits"], rec["compiled"]) == (total, 0)
