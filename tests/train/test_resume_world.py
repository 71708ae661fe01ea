"""Resume at another world size: a checkpoint of 2 ranks continues with 1, and one of 1 with 2.

What must match is the global micro-batch (``training.batchSize`` × world size rows), the seed,
the data and every other training field; the world size (``spec.distributed``, ``--ranks``,
``device.cards``) may change. The samples of a step, the label-token normalisation of the loss,
the schedule, the AdamW state (replicated: the gradients are all-reduced), the routing counts
(global) and the hot set are then those of an uninterrupted run at either world size.

Tolerance (the real engine, tiny preset, fp32 host experts, deterministic kernels): the steps
before the resume are bit for bit those of the uninterrupted run at the old world size; the
learning rates, tokens, sample counts and routing counts are equal everywhere (integers, or a
function of the step); the losses after the resume and the final adapter agree with the
uninterrupted runs to ``ATOL``, not bit for bit: a 2-rank step sums two half-batch gradients
in the all-reduce where 1 rank sums the whole batch at once, so the float sums are taken in
another order (the same tolerance as tests/train/test_train_distributed.py; measured here on
2026-12-03: at most 1.5e-7 on the adapter, 4.8e-7 on the losses).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from testkit import free_port
from train_helpers import adapter_tensors, max_abs_diff, records, run_cli, tiny_manifest

pytest.importorskip("torch")

ATOL = 1e-5
STEPS = 8
CUT = 3  # the first segment's steps (after moe.warmupSteps: the hot set is in its checkpoint)
ENV = {"NPU_LORA_DETERMINISTIC": "1"}


def _manifest(tmp: Path, variant: str, batch: int, **over: Any) -> Path:
    """The run ``w`` (one name: a run directory is resumed only by its own run) in the file
    ``<variant>/w.yaml``. ``constant`` schedule with a warm-up: the rate of a step does not
    depend on the run's length, so a first segment of ``--steps 3`` is the first 3 steps of an
    8-step run."""
    (tmp / variant).mkdir(exist_ok=True)
    spec: dict[str, dict[str, Any]] = {
        "training": {
            "steps": STEPS,
            "batchSize": batch,
            "scheduler": "constant",
            "warmupSteps": 2,
            "learningRate": 5e-3,
        },
        "moe": {"hostThreads": 1, "placement": "hot", "warmupSteps": 2, "hostDtype": "float32"},
        "checkpoint": {"everySteps": 100},
        "distributed": {"port": free_port(), "rendezvousTimeoutSeconds": 60},
    }
    for section, values in over.items():
        spec.setdefault(section, {}).update(values)
    return tiny_manifest(tmp / variant, name="w", **spec)


def _run(manifest: Path, out: Path, ranks: int, *extra: str) -> Any:
    args = ["run", str(manifest), "--out", str(out), "-q", "--no-plot", "--no-tensorboard"]
    if ranks > 1:
        args += ["--ranks", str(ranks)]
    return run_cli(*args, *extra, timeout=600, **ENV)


def _hot(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "checkpoint" / "hot.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Uninterrupted: 1 rank × 4 rows (``u1``), 2 ranks × 2 rows (``u2``). Resumed: 2 ranks for
    3 steps then 1 rank (``a``), 1 rank for 3 steps then 2 ranks (``b``)."""
    tmp = tmp_path_factory.mktemp("world")
    one, two = _manifest(tmp, "one", 4), _manifest(tmp, "two", 2)
    out: dict[str, Any] = {"tmp": tmp, "one": one, "two": two}
    for key, manifest, ranks in (("u1", one, 1), ("u2", two, 2)):
        r = _run(manifest, tmp / key, ranks)
        assert r.returncode == 0, r.stderr[-3000:]
        out[key] = tmp / key
    for key, first, then in (("a", (two, 2), (one, 1)), ("b", (one, 1), (two, 2))):
        r = _run(first[0], tmp / key, first[1], "--steps", str(CUT))
        assert r.returncode == 0, r.stderr[-3000:]
        state = json.loads((tmp / key / "checkpoint" / "state.json").read_text())
        assert state["step"] == CUT and state.get("world_size", 1) == first[1]
        r = _run(then[0], tmp / key, then[1])
        assert r.returncode == 0, r.stderr[-3000:]
        out[key] = tmp / key
        out[f"{key}_err"] = r.stderr
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("key", "before", "after"), [("a", 2, 1), ("b", 1, 2)])
def test_resume_at_another_world_size_continues_the_uninterrupted_run(
    runs: dict[str, Any], key: str, before: int, after: int
) -> None:
    out = runs[key]
    assert f"written by {before} rank(s), this run has {after}" in runs[f"{key}_err"]
    assert f"from the checkpoint at step {CUT}" in runs[f"{key}_err"]
    got = records(out)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))  # every step once
    ref_before = records(runs["u2" if before == 2 else "u1"])
    for rec in (got, records(runs["u1"]), records(runs["u2"])):
        assert len(rec) == STEPS
    for x, y in zip(got[:CUT], ref_before[:CUT], strict=True):
        assert (x["loss"], x["lr"], x["tokens"]) == (y["loss"], y["lr"], y["tokens"])
    for ref in (records(runs["u1"]), records(runs["u2"])):
        for x, y in zip(got, ref, strict=True):
            assert x["lr"] == y["lr"]  # the schedule: a function of the step
            assert x["tokens"] == y["tokens"]  # the same samples (all ranks' tokens)
            assert x["loss"] == pytest.approx(y["loss"], abs=ATOL)
    # the record shows the world size of the step that wrote it
    assert all(r.get("world_size", 1) == before for r in got[:CUT])
    assert all(r.get("world_size", 1) == after for r in got[CUT:])
    for ref in ("u1", "u2"):
        assert max_abs_diff(adapter_tensors(out), adapter_tensors(runs[ref])) <= ATOL
        # routing counts are global (all-reduced) in every checkpoint: equal, integers
        assert _hot(out)["routing_counts"] == _hot(runs[ref])["routing_counts"]
        assert _hot(out)["per_layer"] == _hot(runs[ref])["per_layer"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["resumed_from"] == CUT


@pytest.mark.slow
def test_a_global_batch_change_is_refused_naming_the_field(runs: dict[str, Any]) -> None:
    """2 ranks × 2 rows cannot continue as 1 rank × 2 rows (half the global batch), nor with 3
    ranks (no batch size gives 4 rows); nothing in the run directory changes."""
    src = runs["tmp"] / "src"
    r = _run(runs["two"], src, 2, "--steps", str(CUT))
    assert r.returncode == 0, r.stderr[-3000:]
    before = (src / "metrics.jsonl").read_text(), (src / "config.yaml").read_text()
    r = _run(runs["two"], src, 1)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "spec.training.batchSize × world size" in r.stderr
    assert "2 × 2 ranks = 4 (saved) → 2 × 1 rank = 2 (now)" in r.stderr
    assert "with 1 rank set spec.training.batchSize: 4" in r.stderr
    r = _run(runs["two"], src, 3)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "no spec.training.batchSize gives 4 rows with 3 ranks" in r.stderr
    assert ((src / "metrics.jsonl").read_text(), (src / "config.yaml").read_text()) == before


@pytest.mark.slow
def test_two_ranks_with_dropout_resume_bit_for_bit(tmp_path: Path) -> None:
    """LoRA dropout is seeded per (seed, step, rank) before every step: a 2-rank run stopped
    after 3 steps and resumed with 2 ranks draws the uninterrupted run's masks, so it ends on the
    same adapter bit for bit (two-rank sums are commutative: the all-reduce is exact here)."""
    m = _manifest(tmp_path, "drop", 2, lora={"dropout": 0.1})
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert _run(m, ref, 2).returncode == 0
    assert _run(m, out, 2, "--steps", str(CUT)).returncode == 0
    r = _run(m, out, 2)
    assert r.returncode == 0, r.stderr[-3000:]
    got, want = records(out), records(ref)
    assert [(x["loss"], x["lr"]) for x in got] == [(x["loss"], x["lr"]) for x in want]
    a, b = adapter_tensors(out), adapter_tensors(ref)
    assert all(bool((a[k] == b[k]).all()) for k in a)
    # dropout is on: the same run without it trains to another adapter
    plain = tmp_path / "plain"
    assert _run(_manifest(tmp_path, "plain", 2), plain, 2).returncode == 0
    assert max_abs_diff(adapter_tensors(plain), b) > 1e-4


# ------------------------------------------------------------- the check itself (in process)


def _loaded(tmp: Path, variant: str, batch: int, ranks: int, **over: Any) -> Any:
    from npu_lora.api.load import load_manifest

    path = _manifest(tmp, variant, batch, **over)
    return load_manifest(path, [f"distributed.ranksPerWorker={ranks}"])


def test_the_world_size_may_change_when_the_global_batch_stays(tmp_path: Path) -> None:
    from npu_lora.train.rundir import config_differences, global_batch

    saved = _loaded(tmp_path, "saved", 2, 2)
    assert global_batch(saved) == 4
    for variant, batch, ranks in (("one", 4, 1), ("four", 1, 4), ("same", 2, 2)):
        assert config_differences(saved, _loaded(tmp_path, variant, batch, ranks)) == []
    # workers × ranksPerWorker is the world: 2 workers × 1 rank resume 2 ranks × 1 worker
    nodes = _loaded(tmp_path, "nodes", 2, 1, distributed={"workers": 2, "port": 29511})
    assert global_batch(nodes) == 4 and config_differences(saved, nodes) == []


def test_what_must_match_is_named(tmp_path: Path) -> None:
    from npu_lora.train.rundir import config_differences

    saved = _loaded(tmp_path, "saved", 2, 2)
    (line,) = config_differences(saved, _loaded(tmp_path, "half", 2, 1))
    assert line.startswith("spec.training.batchSize × world size (the global micro-batch): ")
    assert "2 × 2 ranks = 4 (saved) → 2 × 1 rank = 2 (now)" in line
    assert line.endswith("with 1 rank set spec.training.batchSize: 4")
    (line,) = config_differences(saved, _loaded(tmp_path, "three", 2, 3))
    assert "no spec.training.batchSize gives 4 rows with 3 ranks" in line
    # the seed, the accumulation and the data order's other inputs still name their field
    seed = _loaded(tmp_path, "seed", 4, 1, training={"seed": 7})
    assert config_differences(saved, seed) == ["spec.training.seed: 0 (saved) → 7 (now)"]
    accum = _loaded(tmp_path, "accum", 4, 1, training={"gradAccumulation": 2})
    assert config_differences(saved, accum) == [
        "spec.training.gradAccumulation: 1 (saved) → 2 (now)"
    ]


def test_the_step_seed_is_per_step_and_per_rank() -> None:
    from npu_lora.train.loop import step_seed

    seeds = {step_seed(0, s, r) for s in range(1, 51) for r in range(8)}
    assert len(seeds) == 400 and all(0 <= x < 2**63 for x in seeds)
    assert step_seed(0, 3, 1) == step_seed(0, 3, 1) != step_seed(1, 3, 1)
