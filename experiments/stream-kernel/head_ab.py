"""The LM head at the label positions: torch's ``mm`` against the streaming kernel
(``npu_lora.moe.stream_linear``), forward ``y = x Wᵀ`` and backward ``dx = dy W``, in one process,
the four variants in alternating order per round, medians; plus the check that both compute the
same (max error relative to the scale).

    python experiments/stream-kernel/head_ab.py --rows 8 16 32 --dtypes float32 bfloat16 \\
        --rounds 7 --threads 2 --out experiments/raw/2026-12-02-stream-head/head-ab.json

Weights: Qwen3-30B-A3B's LM head shape (151936 x 2048), random (std 0.02).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from npu_lora.machine import machine_facts
from npu_lora.moe import kernels, stream_linear


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gap-s", type=float, default=0.02, help="pause before each timed call")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    mod, isa = kernels.load(), kernels.isa()
    assert mod is not None, kernels.error()
    code = kernels.ISA_CODES[isa]
    out = {"machine": machine_facts(), "isa": isa, "args": vars(a), "cases": []}
    g = torch.Generator().manual_seed(0)
    for dt in a.dtypes:
        dtype = getattr(torch, dt)
        w = (torch.randn(a.vocab, a.hidden, generator=g) * 0.02).to(dtype)
        gb = w.numel() * w.element_size() / 1e9
        for n in a.rows:
            x = torch.randn(n, a.hidden, generator=g).to(dtype)
            dy = torch.randn(n, a.vocab, generator=g).to(dtype)
            block = stream_linear._block(a.vocab)
            calls = {
                "mm fwd": lambda x=x, w=w: x @ w.T,
                "stream fwd": lambda x=x, w=w: mod.dense_forward(
                    x, w, code, stream_linear.FWD_BLOCK
                ),
                "mm bwd": lambda dy=dy, w=w: dy @ w,
                "stream bwd": lambda dy=dy, w=w, b=block: mod.dense_backward(dy, w, code, b),
            }
            ref_y, ref_dx = x.float() @ w.float().T, dy.float() @ w.float()
            err = {
                "fwd": float((calls["stream fwd"]() - ref_y).abs().max() / ref_y.abs().max()),
                "bwd": float((calls["stream bwd"]() - ref_dx).abs().max() / ref_dx.abs().max()),
            }
            times: dict[str, list[float]] = {k: [] for k in calls}
            names = list(calls)
            for f in calls.values():  # warm-up
                f()
            for rnd in range(a.rounds):
                for k in names if rnd % 2 == 0 else names[::-1]:
                    time.sleep(a.gap_s)
                    t0 = time.perf_counter()
                    calls[k]()
                    times[k].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            case = {
                "dtype": dt,
                "rows": n,
                "weight_gb": gb,
                "median_ms": {k: v * 1e3 for k, v in med.items()},
                "gbs": {k: gb / v for k, v in med.items()},
                "stream_over_mm": {
                    "fwd": med["stream fwd"] / med["mm fwd"],
                    "bwd": med["stream bwd"] / med["mm bwd"],
                },
                "max_rel_err_vs_fp32": err,
                "samples_s": times,
            }
            out["cases"].append(case)
            print(
                f"{dt:9s} N={n:3d}: "
                + ", ".join(f"{k} {v * 1e3:6.1f} ms ({gb / v:4.1f} GB/s)" for k, v in med.items())
                + f" | stream/mm fwd {case['stream_over_mm']['fwd']:.2f} bwd "
                f"{case['stream_over_mm']['bwd']:.2f} | err {err['fwd']:.1e} / {err['bwd']:.1e}",
                flush=True,
            )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
