"""Peak RSS of ``npu-lora run`` at Qwen3-30B-A3B widths, reduced depth, against its estimate.

The checkpoint of experiments/q8/load_rss.py (bf16, E=128, H=2048, I=768, top-8, ``--layers``
layers, vocabulary 8,192 so that the experts dominate; hard-linked from ``--from`` when it is
there, else written), a synthetic 8,192-entry byte-level BPE tokenizer
(experiments/memfit/tokenizer_rss.py) as ``model.tokenizer``, the NSMC sample as data, cpu
backend (attention and head on the host in bf16), seqLen 128, 2 steps. Each host dtype in a
fresh process (/usr/bin/time -v + a 20 ms sampler, experiments/memfit/rss_runs.py); the load
quantises the experts expert by expert (models/q8_load.py). Prints one JSON line per dtype with
summary.json's ``memory`` (the estimate the run computed) and peak / estimate.

    flock /tmp/bench.lock python experiments/memfit/q8_run_rss.py --formats int8
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MANIFEST = """apiVersion: npu-lora.io/v1alpha1
kind: MoEFinetune
metadata:
  name: q8-rss-{fmt_name}
spec:
  model:
    path: {ck}
    tokenizer: {tok}
  data:
    path: {data}
    format: nsmc
  lora:
    r: 16
    alpha: 32
    targetModules: [q_proj, v_proj]
  moe:
    placement: host-only
    hostDtype: {fmt}
  training:
    steps: 2
    seqLen: 128
    batchSize: 1
    learningRate: 2.0e-4
    seed: 0
  device:
    backend: cpu
    cards: 0
    dtype: bfloat16
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/memfit/q8ck")
    ap.add_argument("--from", dest="src", default="/tmp/q8ck")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--formats", default="int8,bfloat16")
    ap.add_argument("--out", default="/tmp/memfit/q8run")
    a = ap.parse_args()
    d, src = Path(a.dir), Path(a.src)
    rss = _load("rss_runs", HERE / "rss_runs.py")
    if not (d / "model.safetensors.index.json").is_file():
        d.mkdir(parents=True, exist_ok=True)
        if (src / "model.safetensors.index.json").is_file():
            for f in src.iterdir():
                os.link(f, d / f.name)
        else:
            _load("load_rss", REPO / "experiments/q8/load_rss.py").write(d, a.layers, 8192)
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    tok = Path(a.out) / f"tok{vocab}"
    if not (tok / "tokenizer.json").is_file():
        _load("tokenizer_rss", HERE / "tokenizer_rss.py").write(tok, vocab - 3)
    data = REPO.parent / "shared" / "data" / "nsmc" / "ratings_train.txt"
    for fmt in a.formats.split(","):
        name = fmt.replace("_", "-")
        man = Path(a.out) / f"{name}.yaml"
        man.write_text(MANIFEST.format(fmt_name=name, ck=d, tok=tok, data=data.resolve(), fmt=fmt))
        run_dir = Path(a.out) / f"run-{name}"
        cmd = [sys.executable, "-m", "npu_lora.cli", "run", str(man), "--out", str(run_dir), "-q"]
        rec = {"name": f"qwen3w-{a.layers}l-{fmt}", **rss.measure(cmd)}
        summ = run_dir / "summary.json"
        if summ.is_file():
            mem = json.loads(summ.read_text()).get("memory") or {}
            rec["memory"] = mem
            if mem.get("estimate_bytes"):
                rec["peak_over_estimate"] = round(rec["tree_peak_rss"] / mem["estimate_bytes"], 4)
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
