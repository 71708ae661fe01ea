"""``npu-lora run`` end to end on the tiny model: run directory, loss, callbacks, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from npu_lora.api.v1alpha1 import EXIT_CONFIG_ERROR, EXIT_NONFINITE_LOSS
from npu_lora.cli import main
from npu_lora.train.callbacks import TrainCallback
from train_helpers import records, run_cli, tiny_manifest

RECORD_KEYS = {
    "step",
    "loss",
    "step_s",
    "attn_head_s",
    "host_fwd_s",
    "host_bwd_s",
    "recompute_s",
    "device_calls_per_layer",
    "tokens",
    "hot_experts",
    "keep_graph",
    "placement",
    "lr",
    "grad_norm",
    "time",
}


class Recorder(TrainCallback):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_start(self, ctx):
        self.events.append(("start", ctx.start_step, ctx.total_steps))

    def on_step(self, record, ctx):
        self.events.append(("step", record["step"]))

    def on_hot_selected(self, info, ctx):
        self.events.append(("hot", info["selected_at_step"], info["experts"]))

    def on_checkpoint(self, step, path, ctx):
        assert Path(path, "state.json").is_file()
        self.events.append(("checkpoint", step))

    def on_end(self, summary, ctx):
        self.events.append(("end", summary["steps"]))

    def on_error(self, message, exit_code, ctx):
        self.events.append(("error", exit_code, message))


def test_run_tiny_loss_falls_and_writes_the_run_dir(tmp_path, capsys, monkeypatch):
    """The real engine on the tiny preset: loss falls; every run-dir artifact is there."""
    import npu_lora.commands.run as run_cmd

    rec = Recorder()
    monkeypatch.setattr(run_cmd, "_status_reporter", lambda ctx: rec)
    cfg = tiny_manifest(tmp_path, training={"steps": 16}, checkpoint={"everySteps": 10})
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    stdout = capsys.readouterr().out
    for col in (
        "step_s",
        "attn_head_s",
        "host_fwd_s",
        "host_bwd_s",
        "recompute_s",
        "device calls/layer",
    ):
        assert col in stdout

    recs = records(out)
    assert [r["step"] for r in recs] == list(range(1, 17))
    assert set(recs[0]) >= RECORD_KEYS
    assert all(r["tokens"] == 2 * 64 and r["placement"] == "hot" for r in recs)
    assert [r["hot_experts"] > 0 for r in recs] == [False] * 2 + [True] * 14  # warmupSteps 2
    assert recs[5]["device_calls_per_layer"] == 2.0  # keepGraph: attention + hot experts
    losses = [r["loss"] for r in recs]
    assert all(math.isfinite(x) for x in losses)
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first - 0.3, losses

    cfg_back = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg_back["kind"] == "MoEFinetune" and cfg_back["spec"]["training"]["steps"] == 16
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 16
    assert summary["median_over_steps"] == [3, 16]
    assert summary["first_loss"] == losses[0] and summary["final_loss"] == losses[-1]
    assert summary["median"]["step_s"] > 0 and summary["tokens_per_s"] > 0
    assert summary["hot"]["selected_at_step"] == 2 and "torch" in summary["versions"]
    assert (out / "step_times.png").stat().st_size > 1000
    assert (out / "adapter" / "adapter_config.json").is_file()
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 16
    assert not list(out.glob("checkpoint.*")) and not list(out.glob(".*tmp*"))
    term = json.loads((tmp_path / "termination-log").read_text())
    assert term["status"] == "succeeded" and term["final_loss"] == losses[-1]

    kinds = [e[0] for e in rec.events]
    assert rec.events[0] == ("start", 1, 16) and rec.events[-1] == ("end", 16)
    assert kinds.count("step") == 16
    assert rec.events.index(("hot", 2, 4)) == rec.events.index(("step", 2)) + 1
    assert [e for e in rec.events if e[0] == "checkpoint"] == [
        ("checkpoint", 10),
        ("checkpoint", 16),
    ]

    # a rerun of the finished run resumes at the end: nothing re-run, nothing duplicated
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    assert [r["step"] for r in records(out)] == list(range(1, 17))


def _assert_rejected(tmp_path, code, err, out, *needles):
    assert code == EXIT_CONFIG_ERROR, err
    for n in needles:
        assert n in err, err
    assert not out.exists(), "an invalid run must not create its directory"


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--set", "lora.r=0"], ["spec.lora.r", "greater than or equal to 1"]),
        (["--set", "moe.placement=gpu"], ["spec.moe.placement", "'host-only' or 'hot'"]),
        (["--set", "training.bogus=1"], ["spec.training.bogus", "unknown field"]),
        (
            ["--set", "moe.warmupSteps=50"],
            ["moe.warmupSteps (50) must be less than training.steps"],
        ),
        (["--set", "data.path=/nonexistent/x.tsv"], ["spec.data.path: no such file"]),
        (["--set", "model.tokenizer=/nonexistent"], ["spec.model.tokenizer: no such directory"]),
        (["--set", "training.seqLen=16"], ["spec.training.seqLen: 16 is too short"]),
        (["--steps", "0"], ["--steps"]),
        (["--set", "model={path: /nonexistent/model}"], ["spec.model.path: no such directory"]),
        (
            ["--set", "device.backend=furiosa", "--set", "device.cards=1"],
            ["spec.device.backend: 'furiosa' is not available"],
        ),
    ],
)
def test_invalid_input_exits_2_and_writes_nothing(tmp_path, capsys, extra, needles):
    if "device.backend=furiosa" in extra:
        from npu_lora.backends import furiosa_available

        if furiosa_available():
            pytest.skip("furiosa-torch is installed here")
    cfg = tiny_manifest(tmp_path)
    out = tmp_path / "run"
    code = main(["run", str(cfg), "--out", str(out), "--quiet", *extra])
    _assert_rejected(tmp_path, code, capsys.readouterr().err, out, *needles)
    assert "exit 2" in (tmp_path / "termination-log").read_text()


def test_malformed_data_row_names_the_line(tmp_path, capsys):
    data = tmp_path / "d.tsv"
    data.write_text("id\tdocument\tlabel\n1\t좋다\t1\n2\t별로\tneutral\n", encoding="utf-8")
    cfg = tiny_manifest(tmp_path, data={"path": str(data)})
    out = tmp_path / "run"
    code = main(["run", str(cfg), "--out", str(out), "--quiet"])
    _assert_rejected(tmp_path, code, capsys.readouterr().err, out, "spec.data.path", "d.tsv:3")


def test_invalid_manifest_subprocess(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "apiVersion: npu-lora.io/v1alpha1\nkind: MoEFinetune\nmetadata: {name: bad}\n"
        "spec:\n  model: {preset: tiny-qwen3-moe}\n  data: {path: example:nsmc-mini}\n"
        "  training: {learningRate: -1}\n",
        encoding="utf-8",
    )
    out = tmp_path / "run"
    r = run_cli("run", str(cfg), "--out", str(out), NPU_LORA_TERMINATION_LOG=str(tmp_path / "t"))
    _assert_rejected(
        tmp_path, r.returncode, r.stderr, out, "spec.training.learningRate", "greater than 0"
    )
    assert "Traceback" not in r.stderr
    assert "spec.training.learningRate" in (tmp_path / "t").read_text()


def test_resume_refuses_a_different_training_config(tmp_path, capsys, standin):
    cfg = tiny_manifest(tmp_path, training={"steps": 3}, moe={"placement": "host-only"})
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot"]) == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    code = main(
        ["run", str(cfg), "--out", str(out), "--quiet", "--set", "training.learningRate=0.1"]
    )
    err = capsys.readouterr().err
    assert code == EXIT_CONFIG_ERROR
    assert "spec.training.learningRate: 0.005 (saved) → 0.1 (now)" in err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    # more steps is not a different config: the run continues from its checkpoint
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot", "--steps", "5"]) == 0
    assert [r["step"] for r in records(out)] == [1, 2, 3, 4, 5]
    # fewer steps than the checkpoint: refused
    code = main(["run", str(cfg), "--out", str(out), "--quiet", "--steps", "4"])
    assert code == EXIT_CONFIG_ERROR and "spec.training.steps" in capsys.readouterr().err


def test_nonfinite_loss_writes_the_record_and_exits_3(tmp_path, capsys, standin, monkeypatch):
    import npu_lora.commands.run as run_cmd

    rec = Recorder()
    monkeypatch.setattr(run_cmd, "_status_reporter", lambda ctx: rec)
    orig = run_cmd.build_engine

    def poisoned(spec, vocab_size):
        eng = orig(spec, vocab_size)
        eng.poison_at_call = 4
        return eng

    monkeypatch.setattr(run_cmd, "build_engine", poisoned)
    cfg = tiny_manifest(tmp_path, training={"steps": 8}, checkpoint={"everySteps": 2})
    out = tmp_path / "run"
    code = main(["run", str(cfg), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == EXIT_NONFINITE_LOSS
    assert "non-finite loss (nan) at step 4" in err and "learningRate" in err
    recs = records(out)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert recs[-1]["loss"] is None and recs[-1]["nonfinite"] == "loss"
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 2
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
    assert not (out / "adapter").exists()
    assert rec.events[-1][:2] == ("error", EXIT_NONFINITE_LOSS)
    assert "exit 3: non-finite loss" in (tmp_path / "termination-log").read_text()


def test_grad_accumulation_matches_a_bigger_batch(tmp_path, standin):
    """batch 1 × accumulation 2 gives the weights of batch 2 × accumulation 1 (same samples)."""
    from safetensors.torch import load_file

    outs = []
    for name, b, a in (("b2", 2, 1), ("a2", 1, 2)):
        cfg = tiny_manifest(
            tmp_path,
            name=name,
            training={"steps": 2, "batchSize": b, "gradAccumulation": a},
            moe={"placement": "host-only"},
        )
        outs.append(tmp_path / name)
        assert main(["run", str(cfg), "--out", str(outs[-1]), "--quiet", "--no-plot"]) == 0
    w1 = load_file(str(outs[0] / "adapter" / "adapter_model.safetensors"))
    w2 = load_file(str(outs[1] / "adapter" / "adapter_model.safetensors"))
    assert w1.keys() == w2.keys()
    for k in w1:
        assert (w1[k] - w2[k]).abs().max() < 1e-5, k
    r1, r2 = records(outs[0]), records(outs[1])
    assert [r["tokens"] for r in r1] == [r["tokens"] for r in r2] == [128, 128]
    assert r2[0]["micro_batches"] == 2


def test_status_reporter_is_optional(monkeypatch):
    import importlib.util

    import npu_lora.commands.run as run_cmd

    monkeypatch.setenv("NPU_LORA_RESOURCE_NAME", "x")
    if importlib.util.find_spec("npu_lora.report") is None:
        assert run_cmd._status_reporter(object()) is None
    else:  # the operator's reporter plugs in as a callback (nothing is sent before on_start)
        assert isinstance(run_cmd._status_reporter(object()), TrainCallback)
    monkeypatch.delenv("NPU_LORA_RESOURCE_NAME")
    assert run_cmd._status_reporter(object()) is None


def test_one_process_per_run_dir(tmp_path, capsys, standin):
    import fcntl

    cfg = tiny_manifest(tmp_path, training={"steps": 2}, moe={"placement": "host-only"})
    out = tmp_path / "run"
    out.mkdir()
    with open(out / ".lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        code = main(["run", str(cfg), "--out", str(out), "--quiet"])
    assert code == EXIT_CONFIG_ERROR and "in use by another npu-lora run" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_example_manifest_is_valid():
    from npu_lora.api.load import load_manifest
    from train_helpers import REPO

    m = load_manifest(REPO / "examples" / "tiny-local.yaml")
    assert m.metadata.name == "tiny-local" and m.spec.model.preset == "tiny-qwen3-moe"
    assert m.spec.data.path == "example:nsmc-mini" and m.spec.device.backend == "cpu"
    assert m.spec.moe.placement == "auto"


@pytest.mark.slow
def test_example_tiny_local_runs(tmp_path):
    from train_helpers import REPO

    out = tmp_path / "run"
    r = run_cli("run", str(REPO / "examples" / "tiny-local.yaml"), "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "median per step" in r.stdout and "device calls/layer" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_loss"] < summary["first_loss"] - 0.5


def test_jsonl_example_trains(tmp_path):
    """``example:jsonl-mini`` (text and prompt/completion records, format auto) through the engine."""
    cfg = tiny_manifest(
        tmp_path,
        data={"path": "example:jsonl-mini"},
        training={"steps": 3, "seqLen": 96},
        moe={"placement": "host-only"},
    )
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--no-plot"]) == 0
    recs = records(out)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and r["hot_experts"] == 0 for r in recs)
    assert json.loads((out / "summary.json").read_text())["data"]["kinds"].keys() == {
        "text",
        "prompt",
    }
