"""placement auto, hot-set refresh and the traffic columns through a real run (tiny preset)."""

from __future__ import annotations

import json

from npu_lora.api.v1alpha1 import MoEFinetuneStatus
from npu_lora.cli import main
from npu_lora.report.status import StatusReporter
from train_helpers import tiny_manifest


def _records(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_auto_run_reports_the_choice_traffic_and_hot_history(tmp_path, monkeypatch, caplog):
    import npu_lora.commands.run as run_cmd

    bodies: list[dict] = []
    rep = StatusReporter("t", total_steps=12, min_interval_seconds=0, patch=bodies.append)
    monkeypatch.setattr(run_cmd, "_status_reporter", lambda ctx: rep)
    cfg = tiny_manifest(
        tmp_path,
        moe={"placement": "auto", "warmupSteps": 2, "hotRefreshSteps": 3},
        training={"steps": 12},
        checkpoint={"everySteps": 4},
    )
    out = tmp_path / "run"
    with caplog.at_level("INFO", logger="npu_lora.train.loop"):
        assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    recs = _records(out)
    # steps 3..8 alternate host-only/hot (H D, D H, H D); from step 9 the chosen one
    trial = ["host-only", "hot", "hot", "host-only", "host-only", "hot"]
    assert [r["placement"] for r in recs[2:8]] == trial
    summary = json.loads((out / "summary.json").read_text())
    choice = summary["placement_choice"]
    assert choice["policy"] == "auto" and choice["decided_at_step"] == 8
    assert choice["chosen"] in ("hot", "host-only")
    assert {r["placement"] for r in recs[8:]} == {choice["chosen"]}
    fast = min(
        ("hot", "hot_median_s"), ("host-only", "host_only_median_s"), key=lambda p: choice[p[1]]
    )
    assert choice["chosen"] == fast[0]
    assert summary["median_over_steps"] == [9, 12]  # the trials are warm-up too
    assert any("placement auto: host-only median" in m for m in caplog.messages)
    # traffic in every record, per layer; the selection's copies in step 3
    L = len(recs[0]["traffic_layers"]["to_device_bytes"])
    for r in recs:
        assert r["to_device_bytes"] >= sum(r["traffic_layers"]["to_device_bytes"]) > 0
        assert r["to_host_bytes"] == sum(r["traffic_layers"]["to_host_bytes"])
        assert abs(r["copy_mb"] - (r["to_device_bytes"] + r["to_host_bytes"]) / 1e6) < 1e-9
    assert recs[2]["move_bytes"] > 0 and recs[3]["move_bytes"] == 0
    assert summary["median"]["to_device_bytes"] > 0
    assert len(summary["traffic"]["per_layer_median"]["to_host_bytes"]) == L
    assert summary["hot"]["history"][0]["step"] == 2
    # status: the worker's placement field, valid against the API model; Copy-MB in lastStep
    last = bodies[-1]["status"]
    assert last["placement"]["chosen"] == choice["chosen"]
    assert last["placement"]["decidedAtStep"] == 8
    assert {"hostOnlyMedianS", "hotMedianS"} <= set(last["placement"])
    assert last["lastStep"]["copyMb"] > 0 and last["lastStep"]["toDeviceBytes"] > 0
    MoEFinetuneStatus.model_validate(last)


def test_auto_trials_resume_where_they_stopped(tmp_path, monkeypatch):
    """SIGTERM in the middle of the auto trials (after step 5): the rerun resumes from that
    step's checkpoint and carries on with the same trial order and the trials done before."""
    import os
    import signal

    import npu_lora.commands.run as run_cmd
    from npu_lora.train.callbacks import TrainCallback

    class StopAt(TrainCallback):
        def __init__(self, step: int | None) -> None:
            self.step = step

        def on_step(self, record, ctx):
            if record["step"] == self.step:
                os.kill(os.getpid(), signal.SIGTERM)  # the trainer finishes and checkpoints

    cfg = tiny_manifest(
        tmp_path,
        moe={"placement": "auto", "warmupSteps": 2},
        training={"steps": 10},
        checkpoint={"everySteps": 50},
    )
    out = tmp_path / "run"
    monkeypatch.setattr(run_cmd, "_status_reporter", lambda ctx: StopAt(5))
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 143
    monkeypatch.setattr(run_cmd, "_status_reporter", lambda ctx: StopAt(None))
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    recs = _records(out)
    assert [r["step"] for r in recs] == list(range(1, 11))
    trial = ["host-only", "hot", "hot", "host-only", "host-only", "hot"]
    assert [r["placement"] for r in recs[2:8]] == trial
    summary = json.loads((out / "summary.json").read_text())
    choice = summary["placement_choice"]
    assert summary["resumed_from"] == 5 and choice["decided_at_step"] == 8
    assert [t[1] for t in choice["trials"]] == [3, 4, 5, 6, 7, 8]
    assert [t[0] for t in choice["trials"]] == trial
    assert {r["placement"] for r in recs[8:]} == {choice["chosen"]}
