"""keep_graph vs recompute: HostMLP backward time on the tiny preset (one process, alternating).

Usage: python experiments/hostmlp_keep_graph.py [--seq-len 128] [--rounds 30] [--threads 2]
    [--placement host-only|hot] [--hidden 256 --layers 4 --experts 16 --top-k 4 --moe-inter 128]
Width overrides build a random model directory from the tiny preset's config (fixed seed).
Prints one JSON line per round and a summary (medians) at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings

import torch
from npu_lora.api.v1alpha1 import MoEFinetuneSpec
from npu_lora.engine import build_engine

warnings.filterwarnings("ignore")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--placement", default="host-only")
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--experts", type=int)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--moe-inter", type=int)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_doc: dict = {"preset": "tiny-qwen3-moe"}
    over = {
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_experts": args.experts,
        "num_experts_per_tok": args.top_k,
        "moe_intermediate_size": args.moe_inter,
    }
    over = {k: v for k, v in over.items() if v is not None}
    if over:
        from npu_lora.models import preset_config
        from transformers import AutoModelForCausalLM

        cfg = preset_config("tiny-qwen3-moe")
        for k, v in over.items():
            setattr(cfg, k, v)
        torch.manual_seed(0)
        tmp = tempfile.mkdtemp(prefix="hostmlp-exp-")
        AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp)
        model_doc = {"path": tmp}
    engines = {}
    for keep in (True, False):
        spec = MoEFinetuneSpec.model_validate(
            {
                "model": model_doc,
                "data": {"path": "x"},
                "moe": {"placement": args.placement, "keepGraph": keep, "warmupSteps": 0},
                "training": {"seqLen": args.seq_len, "batchSize": args.batch, "steps": 2},
                "device": {"backend": "cpu"},
            }
        )
        eng = build_engine(spec)
        eng.select_hot_experts(0)
        engines[keep] = eng
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 512, (args.batch, args.seq_len), generator=g)
    labels = ids.clone()
    labels[:, : args.seq_len // 2] = -100
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    for eng in engines.values():  # warm-up
        eng.forward_backward(batch)
    rows: dict[bool, list[dict]] = {True: [], False: []}
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for keep in order:
            eng = engines[keep]
            for p in eng.trainable_parameters():
                p.grad = None
            t0 = time.perf_counter()
            prof = eng.forward_backward(batch)
            step_s = time.perf_counter() - t0
            row = {
                "round": r,
                "keep_graph": keep,
                "step_s": round(step_s, 6),
                "host_fwd_s": round(prof.host_fwd_s, 6),
                "host_bwd_s": round(prof.host_bwd_s, 6),
                "recompute_s": round(prof.recompute_s, 6),
                "attn_head_s": round(prof.attn_head_s, 6),
                "calls_per_layer": prof.device_calls_per_layer,
            }
            rows[keep].append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for keep, rs in rows.items():
        summary["keep_graph" if keep else "recompute"] = {
            k: round(statistics.median(x[k] for x in rs) * 1e3, 3)
            for k in ("step_s", "host_fwd_s", "host_bwd_s", "recompute_s", "attn_head_s")
        }
    kb = summary["keep_graph"]["host_bwd_s"]
    rb = summary["recompute"]["host_bwd_s"]
    summary["host_bwd_reduction_pct"] = round(100 * (1 - kb / rb), 1)
    summary["model"] = over or "tiny-qwen3-moe"
    summary["args"] = vars(args)
    print("SUMMARY (medians, ms)", json.dumps(summary))


if __name__ == "__main__":
    main()
