"""Data-parallel measurements (issue 15): tokens/s with 1 and 2 ranks (1 thread each), the
gradient all-reduce per step, and the resident memory of 1 vs 2 ranks (shared / unshared
experts). Every variant is a real ``npu-lora run`` (the CLI, its own launcher), variants
alternate in order round by round; medians.

    python experiments/raw/2026-12-01-data-parallel/dp_bench.py throughput --rounds 3
    python experiments/raw/2026-12-01-data-parallel/dp_bench.py memory
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def manifest(path: Path, spec: dict[str, Any]) -> Path:
    doc = {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": path.stem},
        "spec": spec,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def tree(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                st = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(st[st.rindex(")") + 2 :].split()[1])
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def mem_kb(pid: int) -> tuple[int, int]:
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def run(cfg: Path, out: Path, ranks: int, env: dict[str, str] | None = None, sample: bool = False):
    cmd = [
        sys.executable,
        "-m",
        "npu_lora.cli",
        "run",
        str(cfg),
        "--out",
        str(out),
        "-q",
        "--no-plot",
        "--no-tensorboard",
        "--ranks",
        str(ranks),
    ]
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples: list[dict[str, Any]] = []
    if sample:

        def loop() -> None:
            while p.poll() is None:
                pids = tree(p.pid)
                ms = [mem_kb(x) for x in pids]
                steps = 0
                mf = out / "metrics.jsonl"
                if mf.exists():
                    steps = len(mf.read_text().splitlines())
                samples.append(
                    {
                        "t": time.monotonic() - t0,
                        "procs": len(pids),
                        "rss_kb": sum(m[0] for m in ms),
                        "pss_kb": sum(m[1] for m in ms),
                        "steps": steps,
                    }
                )
                time.sleep(0.2)

        th = threading.Thread(target=loop, daemon=True)
        th.start()
    _, se = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{se[-3000:]}")
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    return recs, samples, time.monotonic() - t0


def throughput(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dp-tp-"))
    spec = {
        "model": {"preset": "tiny-qwen3-moe"},
        "data": {"path": "example:nsmc-mini"},
        "moe": {"placement": "hot", "warmupSteps": 4, "hostThreads": 1},
        "training": {"steps": args.steps, "seqLen": 128, "batchSize": 4, "learningRate": 5e-3},
        "device": {"backend": "cpu", "cards": 0},
        "checkpoint": {"everySteps": 1000},
        "distributed": {"port": 29731},
    }
    cfg = manifest(tmp / "tp.yaml", spec)
    rows = []
    for rnd in range(args.rounds):
        order = [1, 2] if rnd % 2 == 0 else [2, 1]
        for ranks in order:
            recs, _, wall = run(cfg, tmp / f"r{rnd}-{ranks}", ranks)
            raw = HERE / "throughput-metrics"
            raw.mkdir(exist_ok=True)
            (raw / f"r{rnd}-{ranks}.jsonl").write_text(
                (tmp / f"r{rnd}-{ranks}" / "metrics.jsonl").read_text()
            )
            after = [r for r in recs if r["step"] > 4]
            row = {
                "round": rnd,
                "ranks": ranks,
                "wall_s": wall,
                "step_s": statistics.median(r["step_s"] for r in after),
                "tokens_per_step": after[0]["tokens"],
                "tokens_per_s": statistics.median(r["tokens"] / r["step_s"] for r in after),
                "allreduce_s": statistics.median(r.get("allreduce_s", 0.0) for r in after),
                "allreduce_bytes": after[0].get("allreduce_bytes", 0),
                "skew_s": statistics.median(r.get("skew_s", 0.0) for r in after),
                # the all-reduce less rank 0's wait for the slowest rank
                "allreduce_net_s": statistics.median(
                    r.get("allreduce_s", 0.0)
                    - max(0.0, max(r.get("rank_compute_s") or [0.0]) - (r.get("rank_compute_s") or [0.0])[0])
                    for r in after
                ),
                "compute_s": statistics.median(
                    max(r.get("rank_compute_s") or [r["step_s"]]) for r in after
                ),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    (HERE / "throughput.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ratios = []
    for rnd in range(args.rounds):
        one = next(r for r in rows if r["round"] == rnd and r["ranks"] == 1)
        two = next(r for r in rows if r["round"] == rnd and r["ranks"] == 2)
        ratios.append(two["tokens_per_s"] / one["tokens_per_s"])
    print("per-round tokens/s ratio 2 ranks / 1 rank:", [round(x, 3) for x in ratios],
          "median", statistics.median(ratios))
    for ranks in (1, 2):
        sel = [r for r in rows if r["ranks"] == ranks]
        print(
            ranks,
            "ranks: median tokens/s",
            statistics.median(r["tokens_per_s"] for r in sel),
            "step_s",
            statistics.median(r["step_s"] for r in sel),
            "allreduce_s",
            statistics.median(r["allreduce_s"] for r in sel),
            "skew_s",
            statistics.median(r["skew_s"] for r in sel),
        )


def memory(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dp-mem-"))
    spec = {
        "model": {"preset": "qwen3-30b-a3b", "layers": args.layers},
        "data": {"path": "example:nsmc-mini"},
        "moe": {"placement": "host-only", "hostThreads": 1, "hostDtype": "bfloat16"},
        "training": {"steps": args.steps, "seqLen": 32, "batchSize": 1},
        "device": {"backend": "cpu", "cards": 0},
        "checkpoint": {"everySteps": 1000},
        "distributed": {"port": 29732},
    }
    cfg = manifest(tmp / "mem.yaml", spec)
    rows = []
    for name, ranks, env in (
        ("1 rank", 1, {}),
        ("2 ranks, shared experts", 2, {}),
        ("2 ranks, own experts (NPU_LORA_SHARE_EXPERTS=0)", 2, {"NPU_LORA_SHARE_EXPERTS": "0"}),
    ):
        _, samples, wall = run(
            cfg, tmp / f"m{len(rows)}", ranks, env, sample=True
        )
        row = {"variant": name, "wall_s": wall, **summarize(samples, args.steps)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        (HERE / f"memory-samples-{len(rows)}.jsonl").write_text(
            "".join(json.dumps(s) + "\n" for s in samples)
        )
    (HERE / "memory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def summarize(samples: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Peak over the whole run (model build included); 'training': the samples taken while
    steps 1..steps-1 were done and every rank process was alive (not the teardown)."""
    most = max(s["procs"] for s in samples)
    training = [s for s in samples if 1 <= s["steps"] < steps and s["procs"] == most]
    out: dict[str, Any] = {
        "peak_pss_gb": max(s["pss_kb"] for s in samples) / 2**20,
        "peak_rss_sum_gb": max(s["rss_kb"] for s in samples) / 2**20,
        "samples": len(samples),
        "training_samples": len(training),
    }
    if training:
        out["training_pss_gb"] = statistics.median(s["pss_kb"] for s in training) / 2**20
        out["training_rss_sum_gb"] = statistics.median(s["rss_kb"] for s in training) / 2**20
    return out


def analyze(args: argparse.Namespace) -> None:
    """Recompute memory.jsonl's summaries from the saved samples."""
    rows = [json.loads(x) for x in (HERE / "memory.jsonl").read_text().splitlines() if x]
    for i, row in enumerate(rows, 1):
        samples = [json.loads(x) for x in (HERE / f"memory-samples-{i}.jsonl").read_text().splitlines()]
        row.update(summarize(samples, args.steps))
        print(json.dumps(row))
    (HERE / "memory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--steps", type=int, default=16)
    m = sub.add_parser("memory")
    m.add_argument("--layers", type=int, default=1)
    m.add_argument("--steps", type=int, default=3)
    z = sub.add_parser("analyze")
    z.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    {"throughput": throughput, "memory": memory, "analyze": analyze}[a.cmd](a)


if __name__ == "__main__":
    main()
