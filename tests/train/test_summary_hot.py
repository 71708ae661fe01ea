"""The run summary's hot-expert line says what the last steps ran with."""

from __future__ import annotations

from types import SimpleNamespace

from npu_lora.train.summary import build_summary, timing_table

HOT = {"fraction": 0.25, "experts": 4, "selected_at_step": 4}


def _records(hot_at_end: int) -> list[dict]:
    recs = [{"step": s, "step_s": 0.02, "tokens": 512, "hot_experts": 4} for s in range(1, 11)]
    recs += [
        {"step": s, "step_s": 0.02, "tokens": 512, "hot_experts": hot_at_end} for s in (11, 12)
    ]
    return recs


def _summary(records: list[dict], choice: dict | None) -> dict:
    engine = SimpleNamespace(placement_choice=(lambda: choice) if choice else None)
    kw = {"name": "x", "total_steps": 12, "warmup_steps": 2, "status": "ok"}
    return build_summary(records, engine=engine, hot=HOT, **kw)


def test_auto_choosing_host_only_reports_the_parked_hot_set_as_zero():
    """placement auto parked the 4 selected experts: the table must not say 4 are hot (the
    progress bar and status.lastStep already say 0)."""
    choice = {
        "policy": "auto", "chosen": "host-only", "decided_at_step": 10,
        "host_only_median_s": 0.0214, "hot_median_s": 0.0258,
    }  # fmt: skip
    summary = _summary(_records(0), choice)
    assert summary["hot"]["experts"] == 4 and summary["hot"]["experts_at_end"] == 0
    line = next(x for x in timing_table(summary).splitlines() if "hot experts" in x)
    assert "0 at the end: placement auto chose host-only at step 10" in line
    assert "0.0214 s vs 0.0258 s" in line and "4 selected after step 4" in line


def test_the_hot_line_survives_a_choice_without_medians():
    choice = {"policy": "auto", "chosen": "host-only", "decided_at_step": 10}
    line = next(x for x in timing_table(_summary(_records(0), choice)).splitlines() if "hot" in x)
    assert "0 at the end: placement auto chose host-only at step 10; 4 selected" in line


def test_a_hot_set_in_use_at_the_end_reads_as_before():
    summary = _summary(_records(4), None)
    line = next(x for x in timing_table(summary).splitlines() if "hot experts" in x)
    assert line.split() == ["hot", "experts", "4", "(fraction", "0.25,", "after", "step", "4)"]
