"""Compare the train loss (and eval loss / accuracy where reached) of runs that differ only in
``moe.hostDtype``: per step, the last common step, and the mean over the last N common steps.

    python experiments/q8/quality_table.py bf16=RUN_A int8=RUN_B fp8=RUN_C [--last 20]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _jsonl(p: Path) -> list[dict]:
    if not p.is_file():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="name=RUN_DIR, the first is the reference")
    ap.add_argument("--last", type=int, default=20)
    a = ap.parse_args()
    runs = {}
    for item in a.runs:
        name, _, d = item.partition("=")
        recs = _jsonl(Path(d) / "metrics.jsonl")
        runs[name] = {
            "loss": {r["step"]: r["loss"] for r in recs if "loss" in r},
            "eval": _jsonl(Path(d) / "eval.jsonl"),
        }
    names = list(runs)
    ref = names[0]
    common = sorted(set.intersection(*(set(r["loss"]) for r in runs.values())))
    if not common:
        print("no common step")
        return
    last = common[-1]
    window = common[-a.last :]
    out = {"last_common_step": last, "window": [window[0], window[-1]]}
    for n in names:
        mean = sum(runs[n]["loss"][s] for s in window) / len(window)
        out[n] = {
            "steps": len(runs[n]["loss"]),
            "loss_at_last_common": runs[n]["loss"][last],
            "mean_loss_window": mean,
            "eval": runs[n]["eval"][-1] if runs[n]["eval"] else None,
        }
    for n in names[1:]:
        out[n]["rel_to_" + ref] = {
            "loss_at_last_common": out[n]["loss_at_last_common"] / out[ref]["loss_at_last_common"]
            - 1,
            "mean_loss_window": out[n]["mean_loss_window"] / out[ref]["mean_loss_window"] - 1,
        }
        ev, evr = out[n]["eval"], out[ref]["eval"]
        if ev and evr and ev.get("step") == evr.get("step"):
            out[n]["rel_to_" + ref]["eval_loss"] = ev["loss"] / evr["loss"] - 1
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
