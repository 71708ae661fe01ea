"""Issue 30 item 5, the whole step: tokens/s of a real ``npu-lora run`` (attention, router,
LoRA, optimizer and the host MoE) at Qwen3-30B-A3B widths, 2 layers, S=128 tokens per rank,
for 2 ranks sharing one expert pass, 2 ranks streaming separately and 1 rank.

One ``npu-lora run`` process tree per variant and round, variants in rotating order every round
(round r starts at variant r mod 3), the median ``step_s`` after ``--warmup`` steps of each run;
tokens per step are the run's global tokens (2 ranks: 2 × 128, 1 rank: 128).
The 2-rank variants get ``moe.hostThreads: 1`` per rank (the shared pass's executor then runs
with both ranks' threads), the 1-rank variant 2 threads: every variant uses the 2 cores.

    python experiments/node-pass/whole_step.py --rounds 2 --steps 8 --warmup 3 \
        --out /tmp/whole-step > whole-step.log

Writes ``rounds.jsonl`` (one line per run: variant, round, step seconds, tokens per step, load
average before/after) and prints per-variant medians and the ratios against ``separate``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

VARIANTS: dict[str, dict[str, Any]] = {
    "shared": {"ranks": 2, "threads": 1, "sharedPass": "on"},
    "separate": {"ranks": 2, "threads": 1, "sharedPass": "off"},
    "one-rank": {"ranks": 1, "threads": 2, "sharedPass": "off"},
}


def manifest(name: str, v: dict[str, Any], steps: int, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": name},
        "spec": {
            "model": {"preset": "qwen3-30b-a3b", "layers": 2},
            "data": {"path": "example:nsmc-mini", "format": "nsmc"},
            "lora": {"r": 8, "targetModules": ["q_proj", "v_proj"]},
            "moe": {
                "placement": "host-only",
                "hostDtype": "bfloat16",
                "expertsKernel": "npu_lora_stream",
                "hostThreads": v["threads"],
            },
            "training": {"steps": steps, "seqLen": 128, "batchSize": 1, "seed": 0},
            "device": {"backend": "cpu", "cards": 0, "dtype": "bfloat16"},
            "distributed": {
                "ranksPerWorker": v["ranks"],
                "sharedPass": v["sharedPass"],
                "port": port,
                "rendezvousTimeoutSeconds": 900,
            },
            "checkpoint": {"everySteps": 1000},
        },
    }


def run_one(
    variant: str, rnd: int, steps: int, warmup: int, out: Path, port: int
) -> dict[str, Any]:
    v = VARIANTS[variant]
    d = out / f"{variant}-r{rnd}"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(manifest(f"ws-{variant}-{rnd}", v, steps, port), f)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "npu_lora.cli", "run", f.name, "--out", str(d), "-q"]
    cmd += ["--no-plot", "--no-tensorboard", "--ranks", str(v["ranks"])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{variant} round {rnd}: rc {r.returncode}\n{r.stderr[-3000:]}")
    recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x]
    step_s = [float(x["step_s"]) for x in recs[warmup:]]
    tokens = int(recs[-1]["tokens"])
    return {
        "variant": variant,
        "round": rnd,
        "step_s": step_s,
        "median_step_s": statistics.median(step_s),
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / statistics.median(step_s),
        "host_fwd_s": statistics.median(float(x["host_fwd_s"]) for x in recs[warmup:]),
        "host_bwd_s": statistics.median(float(x["host_bwd_s"]) for x in recs[warmup:]),
        "node_expert_bytes": int(recs[-1].get("node_expert_bytes") or 0),
        "wall_s": wall,
        "load_before": load0,
        "load_after": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/whole-step"))
    ap.add_argument("--port", type=int, default=29731)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    names = list(VARIANTS)
    rows: list[dict[str, Any]] = []
    with (a.out / "rounds.jsonl").open("a") as jf:
        for rnd in range(a.rounds):
            order = names[rnd % 3 :] + names[: rnd % 3]
            for name in order:
                row = run_one(name, rnd, a.steps, a.warmup, a.out, a.port)
                rows.append(row)
                jf.write(json.dumps(row) + "\n")
                jf.flush()
                print(
                    f"round {rnd} {name:<9} step {row['median_step_s']:.3f} s, "
                    f"{row['tokens_per_s']:.1f} tokens/s, host fwd+bwd "
                    f"{row['host_fwd_s'] + row['host_bwd_s']:.3f} s, node expert bytes "
                    f"{row['node_expert_bytes'] / 1e9:.2f} GB, load {row['load_before']:.1f}"
                    f"→{row['load_after']:.1f}",
                    flush=True,
                )
    med = {
        n: statistics.median(r["tokens_per_s"] for r in rows if r["variant"] == n) for n in names
    }
    print("median tokens/s: " + ", ".join(f"{n} {t:.1f}" for n, t in med.items()))
    print(
        f"whole-step tokens/s shared / separate: {med['shared'] / med['separate']:.2f}; "
        f"shared / one rank: {med['shared'] / med['one-rank']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
