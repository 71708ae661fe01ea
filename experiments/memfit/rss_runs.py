"""Peak host memory of whole ``npu-lora run`` processes against ``memory: auto``'s estimate.

Each variant runs in a fresh process (``/usr/bin/time -v``); a sampler sums VmRSS over the
process tree every 50 ms (a multi-rank run: the launcher and its ranks, as a pod's cgroup
sees them). Prints one JSON line per variant: the tree's peak, /usr/bin/time's maximum RSS
(the largest single process), the estimate the run computed (summary.json ``memory``) and the
ratio.

    python experiments/memfit/rss_runs.py --out /tmp/memfit/rss [--only NAME,...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EX = str(REPO / "examples" / "tiny-chat-4k.yaml")
NPU = [sys.executable, "-m", "npu_lora.cli"]
IMPORTS = {
    "import-torch": "import torch",
    "import-stack": "import torch, transformers, peft, tokenizers, safetensors",
}


def variants(out: Path) -> dict[str, list[str]]:
    def run(name: str, *extra: str) -> list[str]:
        return [*NPU, "run", EX, "--out", str(out / name), "-q", *extra]

    v = {k: [sys.executable, "-c", c] for k, c in IMPORTS.items()}
    v["tiny-s256"] = run("tiny-s256", "--set", "training.seqLen=256", "--steps", "3")
    v["tiny-s1024"] = run("tiny-s1024", "--set", "training.seqLen=1024", "--steps", "3")
    v["tiny-s4096"] = run("tiny-s4096")  # the example as shipped: 6 steps
    v["tiny-s4096-noplot"] = run("tiny-s4096-noplot", "--no-plot", "--no-tensorboard")
    v["tiny-hot-s1024"] = run(
        "tiny-hot-s1024",
        "--set",
        "training.seqLen=1024",
        "--set",
        "moe.placement=hot",
        "--set",
        "moe.warmupSteps=1",
        "--steps",
        "3",
    )
    v["tiny-2rank-s1024"] = run(
        "tiny-2rank-s1024",
        "--set",
        "training.seqLen=1024",
        "--set",
        "distributed.ranksPerWorker=2",
        "--steps",
        "3",
    )
    return v


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def rss(pid: int) -> dict[str, int]:
    """VmRSS and its parts (RssAnon, RssFile, RssShmem), bytes."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k = line.split(":", 1)[0]
                if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[k] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def pss(pid: int) -> dict[str, int]:
    """Pss_Anon, Pss_Shmem (smaps_rollup), bytes: a forked child's copy-on-write pages and the
    shared-memory experts split between the processes that map them, counted once in a sum."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                k = line.split(":", 1)[0]
                if k in ("Pss_Anon", "Pss_Shmem"):
                    out[k] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def mapped_checkpoint(pid: int) -> tuple[int, int]:
    """``(rss, checkpoint)`` bytes from one pass over ``/proc/PID/smaps``: the process's RSS and
    the ``*.safetensors`` file pages mapped in it (a checkpoint read through mmap shows in RSS as
    clean page cache the kernel reclaims under a limit). One pass, so that a file closed between
    two reads cannot make RSS less the checkpoint look larger than it was."""
    total = ck = 0
    on = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    on = line.rstrip().endswith(".safetensors")
                elif line.startswith("Rss:"):
                    n = int(line.split()[1]) * 1024
                    total += n
                    ck += n if on else 0
    except OSError:
        pass
    return total, ck


def measure(cmd: list[str]) -> dict:
    p = subprocess.Popen(
        ["/usr/bin/time", "-v", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    peak = {"tree": 0, "procs": 0, "charged": 0, "less_ckpt": 0, "ckpt_at_peak": 0}

    def sample() -> None:
        while p.poll() is None:
            pids = [q for q in tree(p.pid) if q != p.pid]  # not /usr/bin/time itself
            r = [rss(q) for q in pids]
            s = sum(x.get("VmRSS", 0) for x in r)
            # as a cgroup charges it: anonymous and shared-memory pages once (proportional
            # shares: a fork's COW pages are not counted twice), the libraries' file pages once
            # (the largest process's)
            q = [pss(x) for x in pids]
            charged = sum(x.get("Pss_Anon", 0) + x.get("Pss_Shmem", 0) for x in q) + max(
                (x.get("RssFile", 0) for x in r), default=0
            )
            if s > peak["tree"]:
                peak["tree"], peak["procs"] = s, len(pids)
            if len(pids) == 1:  # one process: its RSS less the mapped checkpoint pages
                total, ck = mapped_checkpoint(pids[0])
                if total - ck > peak["less_ckpt"]:
                    peak["less_ckpt"], peak["ckpt_at_peak"] = total - ck, ck
            peak["charged"] = max(peak["charged"], charged)
            time.sleep(0.05)

    th = threading.Thread(target=sample, daemon=True)
    t0 = time.time()
    th.start()
    _out, err = p.communicate()
    th.join()
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    return {
        "rc": p.returncode,
        "wall_s": round(time.time() - t0, 1),
        "tree_peak_rss": peak["tree"],
        "tree_procs": peak["procs"],
        "tree_peak_charged": peak["charged"],
        "peak_rss_less_checkpoint": peak["less_ckpt"],
        "checkpoint_pages_at_that_peak": peak["ckpt_at_peak"],
        "time_max_rss": int(m.group(1)) * 1024 if m else None,
        "stderr_tail": err.split("\tCommand being timed")[0][-600:] if p.returncode else "",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/memfit/rss")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    only = [s for s in a.only.split(",") if s]
    for name, cmd in variants(out).items():
        if only and name not in only:
            continue
        rec = {"name": name, **measure(cmd)}
        summ = out / name / "summary.json"
        if summ.is_file():
            mem = json.loads(summ.read_text()).get("memory") or {}
            rec["memory"] = mem
            est = mem.get("estimate_bytes")
            if est:
                rec["peak_over_estimate"] = round(rec["tree_peak_rss"] / est, 4)
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
