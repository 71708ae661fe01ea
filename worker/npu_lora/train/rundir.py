"""The run directory: config.yaml, metrics.jsonl, resume checks.

Layout::

    config.yaml      the resolved manifest (defaults filled in)
    metrics.jsonl    one profile record per step, appended, flushed and fsynced per step
    checkpoint/      see npu_lora.train.checkpoint
    adapter/         peft save_pretrained, at the end
    summary.json     medians after warm-up, losses, throughput, versions, machine
    step_times.png   stacked per-step time breakdown
    events.out.tfevents.*  TensorBoard scalars (npu_lora.train.tensorboard)

Resume: a directory with a config.yaml is resumed when its training-relevant fields equal the
new run's (the spec fields tagged ``OnUpdate.IMMUTABLE`` in :mod:`npu_lora.api.v1alpha1`:
``model``, ``data``, ``lora``, ``moe``, ``training``), ``training.steps`` excepted (a longer run
may continue a shorter one). metrics.jsonl is cut to the records with
``step <= checkpoint step`` (steps after the checkpoint are run again and recorded again).

The world size (``spec.distributed``, ``device.cards``) may change between the run that wrote the
checkpoint and the one that resumes it; what must stay is the *global* micro-batch,
``training.batchSize`` × world size rows (see :func:`global_batch`): ``training.batchSize`` is
compared as that product, so 2 ranks × 2 rows resume as 1 rank × 4 rows (docs/distributed.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from npu_lora.api.load import SpecError, load_manifest
from npu_lora.api.v1alpha1 import MoEFinetune, OnUpdate, spec_fields
from npu_lora.train.checkpoint import find_checkpoint, fsync_dir

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
PLOT = "step_times.png"
ADAPTER = "adapter"

#: Spec sections whose change makes a checkpoint unusable (``training.steps`` excepted): the
#: ones the server refuses to change on a created run.
TRAINING_FIELDS = spec_fields(OnUpdate.IMMUTABLE)
RESUME_EXEMPT = {"training.steps", "training.epochs"}
#: compared as the global micro-batch (batchSize × world size), not on its own
PER_RANK_FIELDS = {"training.batchSize"}


def world_size(manifest: MoEFinetune) -> int:
    """Ranks of a run of ``manifest`` (``spec.distributed``: workers × ranksPerWorker; else 1)."""
    spec = manifest.spec
    d = spec.distributed
    return d.world_size(spec.device.cards) if d is not None else 1


def global_batch(manifest: MoEFinetune) -> int:
    """Rows of one micro-batch over all ranks: ``training.batchSize`` × world size. With
    ``training.seed`` and ``training.gradAccumulation`` it fixes every step's samples (sample
    ``((step - 1) * accum + micro) * global_batch + row``) and the loss (the mean over the global
    micro-batch's label tokens), whatever the world size."""
    return manifest.spec.training.batch_size * world_size(manifest)


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def global_batch_difference(old: MoEFinetune, new: MoEFinetune) -> str | None:
    """The line naming ``training.batchSize`` when the global micro-batch differs, with the
    batch size that would resume at the new world size (when there is one)."""
    g_old, g_new = global_batch(old), global_batch(new)
    if g_old == g_new:
        return None
    w_old, w_new = world_size(old), world_size(new)
    b_old, b_new = old.spec.training.batch_size, new.spec.training.batch_size
    if g_old % w_new == 0:
        fix = f"with {_ranks(w_new)} set spec.training.batchSize: {g_old // w_new}"
    else:
        fix = (
            f"no spec.training.batchSize gives {g_old} rows with {_ranks(w_new)}: use a world "
            f"size (spec.distributed workers × ranksPerWorker) that divides {g_old}"
        )
    return (
        f"spec.training.batchSize × world size (the global micro-batch): {b_old} × "
        f"{_ranks(w_old)} = {g_old} (saved) → {b_new} × {_ranks(w_new)} = {g_new} (now); {fix}"
    )


def manifest_yaml(manifest: MoEFinetune) -> str:
    doc = manifest.to_api()
    doc.pop("status", None)
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def config_differences(old: MoEFinetune, new: MoEFinetune) -> list[str]:
    """Training-relevant fields that differ, as ``spec.x.y: old → new`` lines
    (``training.batchSize`` as the global micro-batch: the world size may change)."""
    diffs = []
    old_spec = old.spec.model_dump(mode="json", by_alias=True)
    new_spec = new.spec.model_dump(mode="json", by_alias=True)
    for section in TRAINING_FIELDS:
        a = _flatten(old_spec[section], section)
        b = _flatten(new_spec[section], section)
        for key in sorted(set(a) | set(b)):
            if key in RESUME_EXEMPT or key in PER_RANK_FIELDS:
                continue
            if a.get(key) != b.get(key):
                diffs.append(f"spec.{key}: {a.get(key)!r} (saved) → {b.get(key)!r} (now)")
    line = global_batch_difference(old, new)
    if line is not None:
        diffs.append(line)
    return diffs


@dataclass
class ResumePlan:
    """What to do with an existing run directory (decided before anything is written)."""

    exists: bool  # run_dir has a config.yaml
    checkpoint: Path | None = None
    checkpoint_step: int = 0


def plan_resume(run_dir: Path, manifest: MoEFinetune) -> ResumePlan:
    """Check an existing run directory; raise SpecError if it cannot be resumed. Writes nothing."""
    if run_dir.exists() and not run_dir.is_dir():
        raise SpecError(f"--out: {run_dir} exists and is not a directory")
    cfg = run_dir / CONFIG
    if not cfg.is_file():
        if run_dir.is_dir() and any(run_dir.iterdir()):
            leftovers = sorted(p.name for p in run_dir.iterdir())[:5]
            if any(n in (METRICS, "checkpoint", ADAPTER) for n in leftovers):
                raise SpecError(
                    f"--out: {run_dir} holds run files but no {CONFIG}; "
                    "choose another directory or delete it"
                )
        return ResumePlan(exists=False)
    try:
        old = load_manifest(cfg)
    except SpecError as e:
        raise SpecError(f"--out: cannot resume {run_dir}: its {CONFIG} is invalid: {e}") from None
    diffs = config_differences(old, manifest)
    if diffs:
        raise SpecError(
            f"--out: cannot resume {run_dir}: the training configuration differs from its "
            f"{CONFIG}:\n  " + "\n  ".join(diffs) + "\nUse another output directory (--out), "
            "or delete this one to start over."
        )
    found = find_checkpoint(run_dir)
    if found is None:
        return ResumePlan(exists=True)
    path, state = found
    step = int(state["step"])
    steps = manifest.spec.training.steps  # None with epochs: checked once the data is read
    if steps is not None and step > steps:
        raise SpecError(
            f"spec.training.steps: {manifest.spec.training.steps} is less than the step of the "
            f"checkpoint in {run_dir} ({step}); set at least {step}"
        )
    return ResumePlan(exists=True, checkpoint=path, checkpoint_step=step)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:  # disk full, quota: no temporary file left, the old file intact
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Records of metrics.jsonl; a torn last line (killed mid-write) is skipped."""
    out: list[dict[str, Any]] = []
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out.append(rec)
    return out


def truncate_metrics(path: Path, max_step: int) -> list[dict[str, Any]]:
    """Keep the records with ``step <= max_step`` (first occurrence of each); atomic rewrite."""
    kept: dict[int, dict[str, Any]] = {}
    for rec in read_metrics(path):
        if rec["step"] <= max_step and rec["step"] not in kept:
            kept[rec["step"]] = rec
    records = [kept[s] for s in sorted(kept)]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if path.exists() or records:
        write_text_atomic(path, text)
    return records


class MetricsWriter:
    """Append one JSON line per step; fsync each (a killed run loses no written step).

    Unbuffered: a failed write (disk full) raises an OSError naming the file and leaves nothing
    pending that a later ``close`` would try (and fail) to write again.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "ab", buffering=0)  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        try:
            view = memoryview(data)
            while view:
                n = self._f.write(view)
                view = view[n or 0 :]
            os.fsync(self._f.fileno())
        except OSError as e:  # disk full: name the file
            raise OSError(e.errno, e.strerror or str(e), str(self.path)) from e

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
