"""The operator's Prometheus endpoint, scraped over HTTP while it runs a MoEFinetune in the
sandbox and parsed with the Prometheus client's own text parser."""

from __future__ import annotations

import importlib.util
import urllib.request
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


def scrape(url: str) -> dict[str, list[Any]]:
    """{sample name: [samples]} of the endpoint's text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(samples: dict[str, list[Any]], metric: str, **labels: str) -> float | None:
    for s in samples.get(metric, []):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def test_metrics_endpoint(cluster: Cluster, operator: OperatorProcess) -> None:
    before = scrape(operator.metrics_url)
    assert value(before, "npu_lora_runs", kind="MoEFinetune", phase="Running") == 0
    name = "e2e-metrics"
    cluster.apply(manifest(name, steps=3))
    try:
        wait_until(
            lambda: cluster.status(name).get("phase") == "Succeeded", timeout=240, interval=0.5
        )
    except AssertionError:
        raise AssertionError(f"run did not succeed:\n{operator.log()}") from None
    run = {"namespace": "default", "name": name}

    def settled() -> bool:
        m = scrape(operator.metrics_url)
        return value(m, "npu_lora_runs", kind="MoEFinetune", phase="Succeeded") == 1 and (
            value(m, "npu_lora_run_step", **run) == 3
        )

    wait_until(settled, timeout=20, interval=0.3)
    m = scrape(operator.metrics_url)
    assert value(m, "npu_lora_runs", kind="MoEFinetune", phase="Running") == 0
    assert value(m, "npu_lora_jobs_created_total", kind="MoEFinetune") == 1
    assert value(m, "npu_lora_reconcile_duration_seconds_count", handler="ensure_run") >= 1
    assert value(m, "npu_lora_reconcile_duration_seconds_count", handler="job_event") >= 1
    status = cluster.status(name)
    last = status["lastStep"]
    for key, metric in (
        ("stepS", "npu_lora_run_step_seconds"),
        ("attnHeadS", "npu_lora_run_attn_head_seconds"),
        ("hostFwdS", "npu_lora_run_host_fwd_seconds"),
        ("hostBwdS", "npu_lora_run_host_bwd_seconds"),
        ("deviceCallsPerLayer", "npu_lora_run_device_calls_per_layer"),
    ):
        assert value(m, metric, **run) == pytest.approx(last[key]), metric
    assert value(m, "npu_lora_run_progress_ratio", **run) == pytest.approx(1.0)
    # the units follow the conventions: every *_seconds family is a number of seconds >= 0
    assert all(s.value >= 0 for n, ss in m.items() if n.endswith("_seconds") for s in ss)

    # the worker's TensorBoard event files are in the run directory on the output volume
    run_dir = cluster.kubelet.pvc_dir("runs") / name
    assert list(run_dir.glob("events.out.tfevents.*")), sorted(p.name for p in run_dir.iterdir())

    cluster.kubectl("delete", "mft", name, "--wait=false")
    wait_until(
        lambda: value(scrape(operator.metrics_url), "npu_lora_run_step", **run) is None,
        timeout=30,
        interval=0.3,
    )
