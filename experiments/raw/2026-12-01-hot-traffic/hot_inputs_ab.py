"""A/B of the hot path's host-side input preparation (issue 13), interleaved, medians.

legacy  : x_ext = cat(x, zero row) → index_select → .to(device dtype) → to_device (cpu: a view)
padded  : index_select straight from x (padding rows repeat token 0, weight 0) → to_device with
          the cast folded into the copy (cpu backend: one cast; staging only on non-cpu devices)
gathered: x (T rows) → to_device (cast) → index_select with an int32 index "on the device"
          (HotExpertsGathered's first op), what the engine does when Eh·Bk > T

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
from npu_lora.moe.hot import (
    HotLayer,
    default_buckets,
    hot_inputs,
    hot_rows,
    plan_hot_cold,
    send_hot_inputs,
)

VARIANTS = ("legacy", "padded", "gathered")

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


def one(T: int, dtype: torch.dtype, variant: str, be: CpuBackend, gate, hot) -> float:
    x = torch.randn(T, D, requires_grad=True)
    plan = plan_hot_cold(x, gate, hot)
    t0 = time.perf_counter()
    if variant == "gathered":
        tok, r = hot_rows(plan.r_P, plan)
        x_dev = be.to_device(x, layer=0, dtype=dtype)
        i_dev = be.to_device(tok.to(torch.int32), layer=0)
        xd = x_dev.index_select(0, i_dev.reshape(-1))
        rd = be.to_device(r, layer=0, dtype=dtype)
    elif variant == "legacy":
        xs, rs = hot_inputs(x, plan.r_P, plan, legacy=True)
        xd, rd = xs.to(dtype), rs.to(dtype)
    else:
        xs, rs = hot_inputs(x, plan.r_P, plan)
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
            res: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for rep in range(25):
                order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
                for v in order:
                    s = one(T, dtype, v, be, gate, hot)
                    if rep >= 3:
                        res[v].append(s)
                    print(json.dumps({"T": T, "dtype": str(dtype), "variant": v, "rep": rep, "s": s}))
            out = {"summary": True, "T": T, "dtype": str(dtype), "Bk": plan_bk(hot)}
            for v in VARIANTS:
                out[f"median_{v}_s"] = statistics.median(res[v])
                out[f"median_paired_ratio_{v}_vs_legacy"] = statistics.median(
                    a / b for a, b in zip(res[v], res["legacy"], strict=True)
                )
            print(json.dumps(out), flush=True)


def plan_bk(hot: HotLayer) -> dict:
    return {str(k): v for k, v in hot.bucket_hist.items()}


if __name__ == "__main__":
    main()
