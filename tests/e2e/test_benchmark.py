"""The A/B benchmark as a resource: ``kubectl apply -f examples/tiny-benchmark.yaml`` in the
sandbox (real kubectl, real kopf operator, the local kubelet) ends Succeeded with the table in
status, the headline in ``kubectl get -o wide`` and the files in the output volume."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from e2e_harness import ROOT, Cluster, OperatorProcess, wait_until


class Yaml12Loader(yaml.SafeLoader):
    """kubectl writes YAML 1.2: a float such as ``3e-05`` (no dot) is a float there and a string
    to PyYAML's YAML 1.1 resolver (a measured 3.0e-05 s in the status once came back as '3e-05')."""


Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="the worker needs torch (npu-lora[worker])",
    ),
]

EXAMPLE = ROOT / "examples" / "tiny-benchmark.yaml"
SEED_VARIANTS = ["host-only", "host-only+keep_graph", "hot", "hot+keep_graph"]


def test_tiny_benchmark_resource(cluster: Cluster, operator: OperatorProcess) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    name = doc["metadata"]["name"]
    rounds = doc["spec"]["benchmark"]["rounds"]
    seq_lens = doc["spec"]["benchmark"]["seqLens"]
    cluster.kubectl("apply", "-f", str(EXAMPLE))
    # progress: round i of R is reported while it runs
    seen_rounds: set[int] = set()

    def finished() -> bool:
        st = cluster.status(name)
        done = (st.get("benchmark") or {}).get("roundsDone")
        if done is not None:
            seen_rounds.add(done)
        return st.get("phase") in ("Succeeded", "Failed")

    try:
        wait_until(finished, timeout=240, interval=0.3)
    except AssertionError:
        raise AssertionError(f"benchmark did not finish:\n{operator.log()}") from None
    st = cluster.status(name)
    assert st["phase"] == "Succeeded", (st, operator.log())
    bench = st["benchmark"]
    total = rounds * len(seq_lens)
    assert bench["roundsTotal"] == bench["roundsDone"] == total
    assert len(seen_rounds) >= 2, seen_rounds  # intermediate progress was visible
    assert "current" not in bench
    assert st["progress"]["step"] == st["progress"]["totalSteps"] == total
    assert bench["variants"] == 4
    assert [c["seqLen"] for c in bench["cases"]] == seq_lens
    for case in bench["cases"]:
        assert [v["name"] for v in case["variants"]] == SEED_VARIANTS
        assert case["baseline"] == "host-only" and case["best"] in SEED_VARIANTS
        for v in case["variants"]:
            assert v["steps"] == rounds
            for col in ("step_s", "attn_head_s", "host_fwd_s", "host_bwd_s", "recompute_s"):
                assert v["medians"][col] >= 0, (v["name"], col)
            assert v["rounds"] == rounds and 0 <= v["sameSignRounds"] <= rounds
            assert v["ratio"] > 0
        by = {v["name"]: v for v in case["variants"]}
        assert by["host-only"]["ratio"] == 1.0
        assert by["hot"]["medians"]["device_calls_per_layer"] == 3
        assert by["hot+keep_graph"]["medians"]["device_calls_per_layer"] == 2
        assert by["host-only+keep_graph"]["medians"]["recompute_s"] == 0
    best = bench["cases"][-1]["best"]
    assert bench["best"] == best
    assert st["stepSecondsMedian"] == bench["bestStepSeconds"]

    # the headline in kubectl get (wide)
    row = cluster.row(name, "-o", "wide")
    assert row["PHASE"] == "Succeeded" and row["STEP"] == str(total)
    assert row["PROGRESS"] == "100" and st["trainerStatus"]["progressPercentage"] == 100
    assert row["VARIANTS"] == "4" and row["ROUNDS"] == str(total) and row["BEST"] == best
    assert float(row["RATIO"]) == pytest.approx(bench["bestRatio"])
    # the whole table in -o yaml
    out = yaml.load(cluster.kubectl("get", "mft", name, "-o", "yaml").stdout, Yaml12Loader)
    assert out["status"]["benchmark"]["cases"] == bench["cases"]

    # the files in the output volume
    run_dir = Path(cluster.kubelet.pvc_dir("runs")) / name
    assert json.loads((run_dir / "benchmark.json").read_text())["cases"] == bench["cases"]
    assert "| host-only+keep_graph |" in (run_dir / "benchmark.md").read_text()
    for s in seq_lens:
        case_dir = run_dir / f"s{s}-float32-hot0.25"
        for f in ("bench.md", "bench.jsonl", "bench.png"):
            assert (case_dir / f).stat().st_size > 0, case_dir / f
