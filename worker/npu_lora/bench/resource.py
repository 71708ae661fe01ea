"""``spec.benchmark``: the A/B harness run from a MoEFinetune (``npu-lora run``), locally or as
the operator's Job.

Every combination of ``seqLens`` × ``hostDtypes`` × ``hotFractions`` is one *case*: one
:func:`npu_lora.bench.harness.run_bench` on the spec's model, device and MoE settings, writing
``bench.jsonl``, ``bench.md`` and ``bench.png`` to ``<run dir>/<case>/``. The run directory also
gets ``config.yaml`` (the manifest), ``benchmark.md`` (every case's table) and
``benchmark.json`` (what ``status.benchmark`` holds).

Progress goes to ``status.benchmark`` after every round (``roundsDone`` of ``roundsTotal`` over
all cases) and ``status.progress`` (its ``step``/``totalSteps`` count rounds, so
``kubectl get mft``'s STEP column is the rounds done); at the end of each case its table
(per-variant medians of every profile column, paired per-round ratios against the baseline with
same-sign counts, the measured bandwidth, the peer ratio when a peer ran) is appended to
``status.benchmark.cases`` and ``status.stepSecondsMedian`` is the best variant's median s/step.
A failed status patch is logged and never stops the benchmark.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from npu_lora.api.timefmt import rfc3339
from npu_lora.api.v1alpha1 import BenchmarkStatus, MoEFinetune
from npu_lora.bench.stats import TABLE_COLUMNS, column_cell, column_heading
from npu_lora.report.status import _sig as _finite  # 4 significant digits, None if not finite

log = logging.getLogger(__name__)

PEER = "peer@grouped_mm"
PEER_REFERENCE = "host-only+keep_graph"


def cases(manifest: MoEFinetune) -> list[tuple[int, str, float]]:
    """(seqLen, hostDtype, hotFraction) of every case, in run order."""
    spec = manifest.spec
    b = spec.benchmark
    assert b is not None
    fractions = b.hot_fractions or [spec.moe.hot_fraction]
    return [(s, d, h) for s in b.seq_lens for d in b.host_dtypes for h in fractions]


def case_name(seq_len: int, host_dtype: str, hot_fraction: float) -> str:
    return f"s{seq_len}-{host_dtype}-hot{hot_fraction:g}"


def case_table(
    summary: dict[str, Any], seq_len: int, host_dtype: str, hot_fraction: float
) -> dict[str, Any]:
    """``status.benchmark.cases[]`` entry (camelCase) of one harness summary."""
    baseline = summary["baseline"]
    rows = []
    for name, med in summary["medians"].items():
        d = summary["deltas"].get(name) or {}
        rows.append(
            {
                "name": name,
                "steps": int(med.get("n") or 0),
                "medians": {
                    k: v
                    for k, v in ((k, _finite(v)) for k, v in med.items() if k != "n")
                    if v is not None
                },
                "ratio": _finite(d.get("median_ratio")),
                "deltaS": _finite(d.get("median_delta_s")),
                "sameSignRounds": d.get("same_sign_rounds"),
                "rounds": d.get("rounds"),
            }
        )
    timed = [r for r in rows if r["medians"].get("step_s") is not None]
    best = min(timed, key=lambda r: r["medians"]["step_s"])["name"] if timed else None
    limits = summary.get("limits") or {}
    peer_ratio = None
    pair = (summary.get("pairs") or {}).get(f"{PEER_REFERENCE} / {PEER} : step_s")
    if pair:
        peer_ratio = _finite(pair.get("median_ratio"))
    out = {
        "seqLen": seq_len,
        "hostDtype": host_dtype,
        "hotFraction": hot_fraction,
        "baseline": baseline,
        "best": best,
        "copyGbs": _finite(limits.get("copy_gbs")),
        "triadGbs": _finite(limits.get("triad_gbs")),
        "peerRatio": peer_ratio,
        "variants": rows,
    }
    return {k: v for k, v in out.items() if v is not None}


def markdown(status: dict[str, Any]) -> str:
    """``benchmark.md``: one table per case."""
    lines = ["# npu-lora benchmark", ""]
    for c in status.get("cases") or []:
        lines.append(
            f"## seqLen {c['seqLen']}, host {c['hostDtype']}, hot fraction {c['hotFraction']:g}"
        )
        lines.append("")
        head = ["variant", *(column_heading(c) for c in TABLE_COLUMNS), "ratio", "same sign"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in c["variants"]:
            med = r["medians"]
            cells = [r["name"], *(column_cell(c, med.get(c.name), ".4g") for c in TABLE_COLUMNS)]
            ratio = r.get("ratio")
            cells.append("—" if ratio is None else f"{ratio:.3f}")
            cells.append(f"{r.get('sameSignRounds', '—')}/{r.get('rounds', '—')}")
            lines.append("| " + " | ".join(str(x) for x in cells) + " |")
        lines.append("")
        extra = [f"baseline {c['baseline']}", f"best {c.get('best')}"]
        if "copyGbs" in c:
            extra.append(f"copy bandwidth {c['copyGbs']:.3g} GB/s")
        if "peerRatio" in c:
            extra.append(f"{PEER_REFERENCE} / {PEER} {c['peerRatio']:.3f}")
        lines += ["; ".join(extra) + ".", ""]
    return "\n".join(lines)


class BenchmarkReporter:
    """Patches ``status.benchmark`` / ``status.progress`` (when run by the operator)."""

    def __init__(self, patch: Callable[[dict[str, Any]], Any] | None) -> None:
        self.patch = patch

    @classmethod
    def from_env(cls) -> BenchmarkReporter:
        from npu_lora.api.v1alpha1 import ENV_NAME, ENV_NAMESPACE

        name = os.environ.get(ENV_NAME)
        if not name:
            return cls(None)
        from npu_lora.report.status import default_api_patch

        try:
            return cls(default_api_patch(name, os.environ.get(ENV_NAMESPACE) or "default"))
        except Exception as e:  # reporting never stops the benchmark
            log.warning("status reporting disabled: %s", e)
            return cls(None)

    def send(self, bench: dict[str, Any], done: int, total: int, started: float) -> None:
        if self.patch is None:
            return
        elapsed = time.monotonic() - started
        progress: dict[str, Any] = {
            "step": done,
            "totalSteps": total,
            "percent": round(100.0 * done / total, 1) if total else 0.0,
            "lastUpdateTime": rfc3339(),
        }
        if done:
            progress["etaSeconds"] = round(elapsed / done * (total - done), 1)
        from npu_lora.report.status import trainer_status

        best = bench.get("bestStepSeconds")
        # Kubeflow Trainer's view (PROGRESS): rounds for steps, the best variant's median s/step
        body: dict[str, Any] = {
            "status": {
                "benchmark": bench,
                "progress": progress,
                "trainerStatus": trainer_status(progress, None, None, best),
            }
        }
        if best is not None:
            body["status"]["stepSecondsMedian"] = best
        try:
            self.patch(body)
        except Exception as e:  # reporting never stops the benchmark
            log.warning("status patch failed: %s", e)


def run_benchmark(
    manifest: MoEFinetune,
    run_dir: Path,
    *,
    reporter: BenchmarkReporter | None = None,
    log_fn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every case; returns ``status.benchmark`` (also in ``benchmark.json``)."""
    from npu_lora.bench.harness import BenchConfig, run_bench
    from npu_lora.train import rundir

    say = log_fn or (lambda m: print(m, file=sys.stderr, flush=True))
    spec = manifest.spec
    b = spec.benchmark
    if b is None:
        raise ValueError("spec.benchmark is not set")
    reporter = reporter or BenchmarkReporter(None)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir / rundir.CONFIG
    rundir.write_text_atomic(config, rundir.manifest_yaml(manifest))
    todo = cases(manifest)
    variants = len(b.variants) + (2 if b.peers else 0)
    total = b.rounds * len(todo)
    status: dict[str, Any] = {
        "variants": variants,
        "casesTotal": len(todo),
        "roundsTotal": total,
        "roundsDone": 0,
        "output": str(run_dir),
        "cases": [],
    }
    started = time.monotonic()
    reporter.send(status, 0, total, started)
    for i, (seq_len, dtype, fraction) in enumerate(todo):
        name = case_name(seq_len, dtype, fraction)
        status["current"] = name
        cfg = BenchConfig(
            preset=None,
            config=str(config),
            layers=b.layers,
            seq_len=seq_len,
            batch=b.batch_size,
            hot_fraction=fraction,
            hot_warmup_steps=spec.moe.warmup_steps,
            warmup=b.warmup,
            steps_per_round=b.steps_per_round,
            rounds=b.rounds,
            host_dtype=dtype,
            backend=spec.device.backend,
            threads=spec.moe.host_threads,
            experts_impl=spec.moe.experts_kernel,
            variants=list(b.variants),
            baseline=b.baseline,
            peers=b.peers,
            limits=b.bandwidth,
            memory=False,
            seed=spec.training.seed,
            out=str(run_dir / name),
            title=f"{manifest.metadata.name or 'benchmark'}: {name}",
        )
        done_before = i * b.rounds

        def on_round(done: int, _records: list[dict], base: int = done_before) -> None:
            status["roundsDone"] = base + done
            reporter.send(status, base + done, total, started)

        say(f"case {i + 1}/{len(todo)}: {name}")
        summary = run_bench(cfg, log=say, on_round=on_round)
        table = case_table(summary, seq_len, dtype, fraction)
        status["variants"] = len(table["variants"])  # peers are dropped off the cpu backend
        status["cases"].append(table)
        best = table.get("best")
        if best is not None:
            row = next(r for r in table["variants"] if r["name"] == best)
            status["best"] = best
            status["bestStepSeconds"] = row["medians"]["step_s"]
            if row.get("ratio") is not None:
                status["bestRatio"] = row["ratio"]
        reporter.send(status, (i + 1) * b.rounds, total, started)
    status.pop("current", None)
    BenchmarkStatus.model_validate(status)  # the shape the CRD's status schema keeps
    rundir.write_text_atomic(run_dir / "benchmark.json", json.dumps(status, indent=2) + "\n")
    rundir.write_text_atomic(run_dir / "benchmark.md", markdown(status))
    reporter.send({**status, "current": None}, total, total, started)  # null: merge-patch delete
    return status
