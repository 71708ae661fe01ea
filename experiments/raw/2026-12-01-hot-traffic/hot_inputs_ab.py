"""A/B of the hot path's host-side input preparation (issue 13), interleaved, medians.

legacy: x_ext = cat(x, zero row) → index_select → .to(device dtype) → to_device (cpu: a view)
new   : index_select straight from x (padding rows repeat token 0, weight 0) → to_device with
        the cast folded into the copy (cpu backend: one cast; staging only on non-cpu devices)

Forward and backward (the gather's backward is an index_add into dx), Qwen3-30B-A3B widths
(D=2048, E=128, top-8, 32 hot experts), routing from random logits, bucket by the cost rule.
Usage: python hot_inputs_ab.py [T ...]   (prints one JSON line per (T, dtype, variant, rep))
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from npu_lora.backends import CpuBackend
from npu_lora.moe.hot import HotLayer, default_buckets, hot_inputs, plan_hot_cold, send_hot_inputs

torch.set_num_threads(1)
D, E, K, EH, I = 2048, 128, 8, 32, 768


class Gate(torch.nn.Module):
    def __init__(self, logits_TE: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits_TE

    def forward(self, x_TD):
        p = torch.softmax(self.logits + 0 * x_TD[:, :1], dim=-1)  # keeps r differentiable in x
        r, idx = torch.topk(p, K, dim=-1)
        return self.logits, r / r.sum(-1, keepdim=True), idx


def hot_layer(T: int, counts: torch.Tensor, dtype: torch.dtype) -> HotLayer:
    ids = sorted(torch.argsort(-counts, stable=True)[:EH].tolist())
    slot = torch.full((E,), -1, dtype=torch.int64)
    slot[torch.tensor(ids)] = torch.arange(EH)
    return HotLayer(
        ids, slot, None, None, default_buckets(T, K), dtype,  # type: ignore[arg-type]
        row_bytes=2 * D * dtype.itemsize, expert_bytes=3 * I * D * 4,
        overflow_E=torch.zeros(E, dtype=torch.bool), layer=0,
    )


def one(T: int, dtype: torch.dtype, legacy: bool, be: CpuBackend, gate, hot) -> float:
    x = torch.randn(T, D, requires_grad=True)
    plan = plan_hot_cold(x, gate, hot)
    t0 = time.perf_counter()
    xs, rs = hot_inputs(x, plan.r_P, plan, legacy=legacy)
    if legacy:
        xd, rd = xs.to(dtype), rs.to(dtype)
    else:
        hot.legacy = False
        xd, rd = send_hot_inputs(xs, rs, hot, be, 0)
    (xd.float().sum() + rd.float().sum()).backward()
    return time.perf_counter() - t0


def main() -> None:
    Ts = [int(a) for a in sys.argv[1:]] or [512, 2048]
    be = CpuBackend()
    g = torch.Generator().manual_seed(0)
    for T in Ts:
        skew = torch.linspace(3, 0, E)  # skewed routing: hot experts are hot
        logits = torch.randn(T, E, generator=g) + skew
        gate = Gate(logits)
        counts = torch.bincount(torch.topk(logits, K, dim=-1).indices.reshape(-1), minlength=E)
        for dtype in (torch.float32, torch.bfloat16):
            hot = hot_layer(T, counts, dtype)
            res = {False: [], True: []}
            for rep in range(25):
                order = (False, True) if rep % 2 == 0 else (True, False)
                for legacy in order:
                    s = one(T, dtype, legacy, be, gate, hot)
                    if rep >= 3:
                        res[legacy].append(s)
                    print(json.dumps({"T": T, "dtype": str(dtype), "legacy": legacy, "rep": rep, "s": s}))
            m_new, m_old = statistics.median(res[False]), statistics.median(res[True])
            ratios = [a / b for a, b in zip(res[False], res[True], strict=True)]
            print(json.dumps({"summary": True, "T": T, "dtype": str(dtype), "Bk": plan_bk(hot),
                              "median_new_s": m_new, "median_legacy_s": m_old,
                              "median_paired_ratio": statistics.median(ratios)}), flush=True)


def plan_bk(hot: HotLayer) -> dict:
    return {str(k): v for k, v in hot.bucket_hist.items()}


if __name__ == "__main__":
    main()
