"""spec.eval end to end: kubectl apply → operator → Job → `npu-lora run` evaluates a held-out
fraction → status.eval, the EVAL column (and ACC with -o wide) in `kubectl get mft`."""

from __future__ import annotations

import importlib.util
import json
import re

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


def test_eval_column_and_status_eval(cluster: Cluster, operator: OperatorProcess) -> None:
    name = "e2e-eval"
    cluster.apply(
        manifest(
            name,
            steps=6,
            eval={"fraction": 0.05, "everySteps": 3, "maxExamples": 8},
        )
    )
    wait_until(
        lambda: cluster.status(name).get("phase") in ("Succeeded", "Failed"),
        timeout=300,
        interval=0.5,
    )
    st = cluster.status(name)
    assert st["phase"] == "Succeeded", st
    ev = st["eval"]
    assert ev["step"] == 6 and ev["loss"] > 0 and ev["examples"] == 8
    assert 0.0 <= ev["accuracy"] <= 1.0  # NSMC: classification
    assert ev["best"]["step"] in (3, 6) and ev["best"]["loss"] <= ev["loss"]
    row = cluster.row(name)
    assert NUM.match(row["EVAL"]), row
    assert abs(float(row["EVAL"]) - ev["loss"]) < 1e-3 * max(1.0, ev["loss"])
    wide = cluster.row(name, "-o", "wide")
    assert NUM.match(wide["ACC"]), wide
    run_dir = cluster.kubelet.pvc_dir("runs") / name
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [3, 6]
    assert (run_dir / "adapter-best").is_dir()
