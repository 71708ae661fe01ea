"""Compile a run's device-graph plan one after another vs in N parallel processes (issue 29).

What the operator's precompile Indexed Job does (one process per graph, as pods, at most N at a
time) against what a run without it does (one process compiling graph after graph), with the real
compiler for the cpu backend (``torch.compile`` with inductor, each graph into a cold cache).
Rounds alternate the order of the two variants; every round uses fresh cache directories.

Per process it records wall time and CPU time (user + sys of the child, from ``wait4``), so a
cluster projection can use CPU seconds (less sensitive to other load on a shared machine) and the
measured start-up cost of a process. Also per round: the load average and the CPU time used by
other processes during the round (``/proc/stat`` total busy minus ours).

    python experiments/compile_fanout.py examples/qwen3-30b-a3b-nsmc.yaml \\
        --model-config ../shared/data/qwen3-30b-a3b/config.json --indexes 0,1,2,10,15 \\
        --parallel 2 --rounds 2 --out /tmp/fanout.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERIAL = """
import json, sys, time
from pathlib import Path
from npu_lora.commands.compile_plan import load_plan
from npu_lora.compile.precompile import compile_entry
plan = load_plan(Path(sys.argv[1]), [], "cpu", Path(sys.argv[2]))
for i in [int(x) for x in sys.argv[4].split(",")]:
    t0 = time.perf_counter()
    row = compile_entry(plan, plan.by_index(i), Path(sys.argv[3]))
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(row), flush=True)
"""


def _busy_ticks() -> int:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return user + nice + system + irq + softirq + steal


def _wait(p: subprocess.Popen) -> tuple[int, float]:
    _pid, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, usage.ru_utime + usage.ru_stime


def _run_serial(args: argparse.Namespace, cache: Path) -> dict:
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-c", SERIAL, args.file, args.model_config, str(cache), args.indexes],
        stdout=subprocess.PIPE,
        text=True,
    )
    out = p.stdout.read() if p.stdout else ""
    rc, cpu = _wait(p)
    if rc != 0:
        raise SystemExit(f"serial compile failed (rc {rc})")
    graphs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {"wall_s": time.perf_counter() - t0, "cpu_s": cpu, "graphs": graphs}


def _run_parallel(args: argparse.Namespace, cache: Path) -> dict:
    todo = [int(x) for x in args.indexes.split(",")]
    running: list[tuple[int, float, subprocess.Popen]] = []
    graphs, cpu_total = [], 0.0
    t0 = time.perf_counter()
    while todo or running:
        while todo and len(running) < args.parallel:
            i = todo.pop(0)
            cmd = [sys.executable, "-m", "npu_lora.cli", "precompile", args.file, "--backend"]
            cmd += ["cpu", "--model-config", args.model_config, "--index", str(i)]
            cmd += ["--cache", str(cache)]
            running.append((i, time.perf_counter(), subprocess.Popen(cmd, stdout=subprocess.PIPE)))
        pid, status, usage = os.wait4(-1, 0)
        for item in running:
            if item[2].pid == pid:
                i, started, p = item
                running.remove(item)
                p.returncode = os.waitstatus_to_exitcode(status)
                out = p.stdout.read().decode() if p.stdout else ""
                if p.returncode != 0:
                    raise SystemExit(f"graph {i} failed (rc {p.returncode})")
                row = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
                row["process_wall_s"] = round(time.perf_counter() - started, 3)
                row["process_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
                cpu_total += usage.ru_utime + usage.ru_stime
                graphs.append(row)
                break
    return {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_total, "graphs": graphs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--indexes", required=True, help="comma-separated plan indexes")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    hz = os.sysconf("SC_CLK_TCK")
    with open(args.out, "a") as out:
        for r in range(args.rounds):
            order = ["serial", "parallel"] if r % 2 == 0 else ["parallel", "serial"]
            for variant in order:
                with tempfile.TemporaryDirectory(prefix=f"fanout-{variant}-") as d:
                    busy0, t0 = _busy_ticks(), time.perf_counter()
                    run = (_run_serial if variant == "serial" else _run_parallel)(args, Path(d))
                    busy = (_busy_ticks() - busy0) / hz
                    wall = time.perf_counter() - t0
                row = {
                    "kind": "fanout",
                    "round": r,
                    "variant": variant,
                    "parallel": args.parallel if variant == "parallel" else 1,
                    "indexes": args.indexes,
                    "wall_s": round(run["wall_s"], 3),
                    "cpu_s": round(run["cpu_s"], 3),
                    "others_cpu_s": round(max(0.0, busy - run["cpu_s"]), 1),
                    "others_share": round(max(0.0, busy - run["cpu_s"]) / wall, 2),
                    "loadavg": os.getloadavg()[0],
                    "graphs": run["graphs"],
                }
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(
                    f"round {r} {variant:8s} wall {row['wall_s']:7.1f} s  cpu {row['cpu_s']:7.1f} s"
                    f"  others {row['others_cpu_s']:6.1f} cpu-s  load {row['loadavg']:.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
