"""Issue 12: pre-flight refusals, storage errors, data confinement, run identity, deletion."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from npu_lora.api.v1alpha1 import EXIT_CONFIG_ERROR
from npu_lora.train import checkpoint as ckpt
from npu_lora.train.preflight import estimate_memory, model_widths, parse_bytes
from train_helpers import as_run, run_in_process, snapshot, tiny_manifest

EXIT_ERROR = 1


def _refused(code: int, err: str, out: Path, *needles: str) -> None:
    assert code == EXIT_CONFIG_ERROR, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    assert not out.exists(), "a refused run must not create its directory"


# --- memory pre-flight ------------------------------------------------------------------------


def test_huge_batch_is_refused_at_once_with_the_figure(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NPU_LORA_MEMORY_LIMIT", raising=False)
    cfg = tiny_manifest(tmp_path, training={"batchSize": 4096, "seqLen": 32768})
    out = tmp_path / "run"
    t0 = time.perf_counter()
    code = run_in_process(cfg, out)
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    _refused(code, err, out, "spec.training.batchSize: 4096", "spec.training.seqLen: 32768")
    assert "GiB" in err and "more than the memory limit" in err
    assert took < 1.0, took


def test_memory_limit_from_the_environment(tmp_path, capsys, monkeypatch, standin):
    cfg = tiny_manifest(tmp_path, training={"steps": 3}, moe={"placement": "host-only"})
    out = tmp_path / "run"
    monkeypatch.setenv("NPU_LORA_MEMORY_LIMIT", "64Ki")
    _refused(run_in_process(cfg, out), capsys.readouterr().err, out, "NPU_LORA_MEMORY_LIMIT")
    monkeypatch.setenv("NPU_LORA_MEMORY_LIMIT", "none")
    assert run_in_process(cfg, out) == 0


def test_memory_estimate_formula_on_qwen3_widths():
    from npu_lora.api.load import load_manifest

    m = load_manifest(
        {
            "model": {"preset": "qwen3-30b-a3b", "layers": 2},
            "data": {"path": "example:nsmc-mini"},
            "training": {"batchSize": 1, "seqLen": 128},
            "device": {"backend": "cpu"},
        }
    )
    cfg = model_widths(m.spec)
    est = estimate_memory(m.spec, cfg)
    H, I, E, k, L = 2048, 768, 128, 8, 2  # noqa: E741
    assert est.weights > L * 3 * E * I * H * 4  # the experts alone, fp32
    from npu_lora.api.memory import long_row_bytes

    # per token and layer (attention on the cpu backend, the block input, the kept MoE graph)
    # plus what grows with the row (mask, label gather, attention core, head chunk)
    per_token = 4 * 128 * L * (6 * H + H + k * 3 * I)
    assert est.activations == per_token + long_row_bytes(m.spec, cfg)
    assert parse_bytes("2Gi") == 2 << 30 and parse_bytes("none") is None


# --- --out ------------------------------------------------------------------------------------


def test_out_under_a_regular_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    cfg = tiny_manifest(tmp_path)
    code = run_in_process(cfg, f / "run")
    _refused(code, capsys.readouterr().err, f / "run", f"{f} is a file", "--out")


def test_out_on_a_read_only_filesystem(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = False
    if os.geteuid() == 0:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)])
        mounted = r.returncode == 0
        if not mounted:
            pytest.skip("root without mount permission: no read-only filesystem to test on")
    else:
        ro.chmod(0o555)
    try:
        code = run_in_process(tiny_manifest(tmp_path), ro / "run")
        err = capsys.readouterr().err
        _refused(code, err, ro / "run", f"--out: cannot write the run directory {ro / 'run'}")
        assert ("read-only file system" if mounted else "permission denied") in err
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)])
        else:
            ro.chmod(0o755)


# --- disk full --------------------------------------------------------------------------------


def test_disk_full_at_a_checkpoint_keeps_the_previous_one(tmp_path, capsys, monkeypatch, standin):
    real_save = ckpt.save_tree
    calls = {"n": 0}

    def full_after_first_checkpoint(obj, path):
        if path.parent.name.startswith("checkpoint.tmp-") and path.name == "optimizer":
            calls["n"] += 1
            if calls["n"] >= 2:
                target = path.with_name("optimizer.safetensors")
                with open(target, "wb") as f:
                    f.write(b"partial")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        return real_save(obj, path)

    monkeypatch.setattr(ckpt, "save_tree", full_after_first_checkpoint)
    cfg = tiny_manifest(
        tmp_path, training={"steps": 12}, moe={"placement": "host-only"}, checkpoint={}
    )
    out = tmp_path / "run"
    code = run_in_process(cfg, out)
    err = capsys.readouterr().err
    assert code == EXIT_ERROR, err
    assert "Traceback" not in err
    assert f"cannot write the checkpoint of step 10 to {out}/checkpoint.tmp-" in err
    assert "optimizer.safetensors: No space left on device" in err
    assert f"the previous checkpoint (step 5) in {out / 'checkpoint'} is intact" in err
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 5
    assert not list(out.glob("*.tmp*")) and not list(out.glob(".*.tmp*"))
    # and the run resumes from it once there is room again
    monkeypatch.setattr(ckpt, "save_tree", real_save)
    assert run_in_process(cfg, out) == 0
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [
        *range(1, 13)
    ]


# --- data outside the data root ---------------------------------------------------------------


def test_data_outside_the_data_root_is_not_read(tmp_path, capsys, monkeypatch):
    secret = tmp_path / "secret.tsv"
    secret.write_text("SECRET-FIRST-LINE\n")
    root = tmp_path / "data"
    root.mkdir()
    (root / "link.tsv").symlink_to(secret)
    monkeypatch.setenv("NPU_LORA_DATA_ROOT", str(root))
    for path in (str(secret), "../secret.tsv", str(root / "link.tsv")):
        out = tmp_path / "run"
        cfg = tiny_manifest(tmp_path, data={"path": path, "volume": {"claimName": "d"}})
        code = run_in_process(cfg, out)
        err = capsys.readouterr().err
        _refused(code, err, out, "spec.data.path", f"outside the data root {root}")
        assert "SECRET" not in err


def test_data_file_contents_are_not_echoed(tmp_path, capsys):
    secret = tmp_path / "secret.tsv"
    secret.write_text("root:x:0:0:SECRET-FIRST-LINE\n")
    out = tmp_path / "run"
    code = run_in_process(tiny_manifest(tmp_path, data={"path": str(secret)}), out)
    err = capsys.readouterr().err
    _refused(code, err, out, "spec.data.path", "expected the NSMC header")
    assert "SECRET" not in err and "root:x" not in err


# --- run identity -----------------------------------------------------------------------------


def test_another_namespace_never_resumes_or_overwrites(tmp_path, capsys, monkeypatch, standin):
    cfg = tiny_manifest(
        tmp_path, name="same", training={"steps": 3}, moe={"placement": "host-only"}
    )
    out = tmp_path / "run"
    as_run(monkeypatch, "a", "uid-a")
    assert run_in_process(cfg, out) == 0
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["run"]["namespace"] == "a" and state["run"]["uid"] == "uid-a"
    before = snapshot(out)
    capsys.readouterr()
    as_run(monkeypatch, "b", "uid-b")
    code = run_in_process(cfg, out)
    err = capsys.readouterr().err
    assert code == EXIT_CONFIG_ERROR and "Traceback" not in err
    assert "belongs to run a/same (uid uid-a), not to this run b/same (uid uid-b)" in err
    assert snapshot(out) == before


def test_recreated_run_starts_fresh_unless_asked_to_resume(tmp_path, capsys, monkeypatch, standin):
    cfg = tiny_manifest(
        tmp_path, name="same", training={"steps": 3}, moe={"placement": "host-only"}
    )
    out = tmp_path / "run"
    as_run(monkeypatch, "a", "uid-1")
    assert run_in_process(cfg, out) == 0
    old = snapshot(out)
    # deleted and re-created: a new UID, same namespace and name -> fresh, old files kept aside
    as_run(monkeypatch, "a", "uid-2")
    assert run_in_process(cfg, out) == 0
    err = capsys.readouterr().err
    assert "starting fresh" in err
    aside = tmp_path / "run.prev-uid-1"
    assert snapshot(aside) == old
    assert json.loads((out / "run.json").read_text())["uid"] == "uid-2"
    assert "resuming" not in err
    # re-created again, asking to continue its own directory: resumes at the checkpoint
    as_run(monkeypatch, "a", "uid-3")
    code = run_in_process(cfg, out, "--set", "resumeFrom=run", "--steps", "5")
    err = capsys.readouterr().err
    assert code == 0, err
    assert "from the checkpoint at step 3" in err
    recs = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert recs == [1, 2, 3, 4, 5]
    # another run of the namespace may start from it, into a directory of its own (the source
    # only read); another namespace may not, and no absolute path is accepted
    before = snapshot(out)
    own = tmp_path / "b-run"
    as_run(monkeypatch, "b", "uid-b")
    assert run_in_process(cfg, own, "--set", f"resumeFrom={out}", "--steps", "6") == 2
    assert "spec.resumeFrom: " in (err := capsys.readouterr().err) and "is absolute" in err
    assert run_in_process(cfg, own, "--set", "resumeFrom=run", "--steps", "6") == 2
    assert "of another namespace than this run (b)" in capsys.readouterr().err
    assert not own.exists()
    as_run(monkeypatch, "a", "uid-a2")
    assert run_in_process(cfg, own, "--set", "resumeFrom=run", "--steps", "6") == 0
    assert "starting from the checkpoint of" in capsys.readouterr().err
    assert [json.loads(x)["step"] for x in (own / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert snapshot(out) == before


def test_local_rerun_keeps_its_run_id(tmp_path, standin):
    cfg = tiny_manifest(tmp_path, training={"steps": 2}, moe={"placement": "host-only"})
    out = tmp_path / "run"
    assert run_in_process(cfg, out) == 0
    first = json.loads((out / "run.json").read_text())
    assert first["uid"] is None and first["runId"].startswith("local-")
    assert run_in_process(cfg, out, "--steps", "3") == 0
    assert json.loads((out / "run.json").read_text())["runId"] == first["runId"]


# --- deletion ---------------------------------------------------------------------------------


class _Forbidden(Exception):
    status = 403


def test_deleted_run_stops_cleanly_on_403(tmp_path, capsys, monkeypatch, standin):
    import npu_lora.commands.run as run_cmd
    from npu_lora.report.status import StatusReporter

    calls = {"n": 0}

    def patch(body):
        calls["n"] += 1
        if calls["n"] > 2:  # the Role went first in the deletion cascade
            raise _Forbidden("forbidden")

    def reporter(ctx):
        return StatusReporter(
            "same", "a", total_steps=ctx.total_steps, min_interval_seconds=0.0, patch=patch
        )

    monkeypatch.setattr(run_cmd, "_status_reporter", reporter)
    monkeypatch.setenv("NPU_LORA_RESOURCE_NAME", "same")
    cfg = tiny_manifest(tmp_path, training={"steps": 200}, moe={"placement": "host-only"})
    out = tmp_path / "run"
    code = run_in_process(cfg, out)
    err = capsys.readouterr().err
    assert code == 143, err
    assert "the MoEFinetune a/same was deleted (its status patch answered 403)" in err
    assert "Traceback" not in err
    step = json.loads((out / "checkpoint" / "state.json").read_text())["step"]
    assert 1 <= step < 200
    assert "was deleted" in (tmp_path / "termination-log").read_text()
