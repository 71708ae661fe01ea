"""The operator's Prometheus metrics: names, units, the run cache, handler instrumentation."""

from __future__ import annotations

import pytest
from npu_lora.api import record as step_record
from npu_lora_operator import metrics as prom
from npu_lora_operator.settings import default_metrics_port
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families


def _families(collector) -> dict[str, object]:
    reg = CollectorRegistry()
    reg.register(collector)
    text = generate_latest(reg).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_last_step_metric_names_follow_the_conventions():
    names = {c.name: prom.last_step_metric(c) for c in step_record.STATUS_FIELDS}
    assert names["step_s"] == "npu_lora_run_step_seconds"
    assert names["attn_head_s"] == "npu_lora_run_attn_head_seconds"
    assert names["host_fwd_s"] == "npu_lora_run_host_fwd_seconds"
    assert names["step"] == "npu_lora_run_step"
    for c in step_record.STATUS_FIELDS:
        if c.unit == "s":
            assert names[c.name].endswith("_seconds"), c.name


def test_run_cache_exports_phases_and_the_last_step():
    cache = prom.RunCache()
    cache.observe(
        "MoEFinetune",
        "ns",
        "a",
        {
            "phase": "Running",
            "lastStep": {"step": 7, "stepS": 1.5, "attnHeadS": 0.25, "loss": 2.0},
            "stepSecondsMedian": 1.4,
            "progress": {"percent": 35.0, "etaSeconds": 20},
            "hot": {"experts": 12},
        },
    )
    cache.observe("MoEFinetune", "ns", "b", {"phase": "Succeeded"})
    cache.observe("MoEFinetune", "ns", "c", {})  # no status yet: Pending
    fam = _families(cache)
    phases = {s.labels["phase"]: s.value for s in fam["npu_lora_runs"].samples}
    assert phases == {"Pending": 1, "Running": 1, "Succeeded": 1, "Failed": 0, "Suspended": 0}
    one = {"namespace": "ns", "name": "a"}

    def v(name):
        (s,) = [s for s in fam[name].samples if s.labels == one]
        return s.value

    assert v("npu_lora_run_step") == 7
    assert v("npu_lora_run_step_seconds") == 1.5
    assert v("npu_lora_run_attn_head_seconds") == 0.25
    assert v("npu_lora_run_loss") == 2.0
    assert v("npu_lora_run_step_seconds_median") == 1.4
    assert v("npu_lora_run_progress_ratio") == pytest.approx(0.35)
    assert v("npu_lora_run_eta_seconds") == 20
    assert v("npu_lora_run_hot_experts") == 12
    assert fam["npu_lora_run_host_fwd_seconds"].samples == []  # not reported: no sample
    cache.forget("MoEFinetune", "ns", "a")
    fam = _families(cache)
    assert fam["npu_lora_run_step"].samples == []


def test_instrumented_times_calls_and_counts_errors():
    @prom.instrumented("unit_test_handler")
    def handler(fail: bool = False) -> str:
        if fail:
            raise ValueError("boom")
        return "ok"

    def count() -> float:
        return prom.RECONCILE_SECONDS.labels(
            "unit_test_handler"
        )._sum.get(), prom.RECONCILE_ERRORS.labels("unit_test_handler", "ValueError")._value.get()

    _, errors0 = count()
    assert handler() == "ok"
    with pytest.raises(ValueError, match="boom"):
        handler(fail=True)
    _, errors1 = count()
    assert errors1 == errors0 + 1
    assert handler.__name__ == "handler"  # kopf names handlers after the function


def test_metrics_port_from_the_environment():
    assert default_metrics_port({}) == 0
    assert default_metrics_port({"NPU_LORA_METRICS_PORT": "9100"}) == 9100
    with pytest.raises(ValueError, match="NPU_LORA_METRICS_PORT"):
        default_metrics_port({"NPU_LORA_METRICS_PORT": "http"})
    with pytest.raises(ValueError, match="out of range"):
        default_metrics_port({"NPU_LORA_METRICS_PORT": "70000"})
