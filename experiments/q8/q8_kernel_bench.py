"""bf16 vs int8 vs fp8 frozen experts on the stream kernel at Qwen3-30B-A3B widths (E=128, H=2048,
I=768, top-8), L layers, T tokens: forward and input-gradient wall time, paired per round
(variants interleaved in one process, order rotated), bytes-read bandwidth, and each layer's
output / dX error against the bf16 kernel. Prints one JSON line per round and a summary.

    python experiments/q8/q8_kernel_bench.py --layers 2 --tokens 128 --rounds 7

``--cache DIR``: the weights (bf16 + both 8-bit copies, quantised in torch, minutes) are saved
there on the first run and memory-mapped on the next (build them outside the bench lock).
``--old``: also the 8-bit variants on the fp32-operand ``avx512`` kernels (``int8/avx512``,
``fp8/avx512``: the kernels before the bf16-operand ones), in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from npu_lora.models import quant
from npu_lora.moe import kernels, stream
from npu_lora.moe.kernels import ops
from npu_lora.moe.routing import build_routing


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--cache", default=None, help="directory for the weights (saved / mapped)")
    ap.add_argument("--old", action="store_true", help="also the fp32-operand avx512 kernels")
    ap.add_argument("--prepare", action="store_true", help="only write the --cache weights")
    a = ap.parse_args()
    E, H, inter, K, T = a.experts, a.hidden, a.inter, a.topk, a.tokens
    isa = None if a.prepare else kernels.isa()
    code = kernels.ISA_CODES[isa] if isa else 0
    mod = None if a.prepare else kernels.load()
    g = torch.Generator().manual_seed(0)
    layers = []
    for li in range(a.layers):
        gu = torch.randn(E, 2 * inter, H, generator=g, dtype=torch.bfloat16).mul_(0.02)
        dn = torch.randn(E, H, inter, generator=g, dtype=torch.bfloat16).mul_(0.02)
        path = os.path.join(a.cache, f"layer{li}_E{E}_H{H}_I{inter}.pt") if a.cache else None
        if path and os.path.exists(path):
            lay = torch.load(path, mmap=True)
        else:
            lay = {"bf16": (gu, dn)}
            for f in (quant.INT8, quant.FP8):
                lay[f] = (*quant.quantize(gu, f), *quant.quantize(dn, f))
            if path:
                os.makedirs(a.cache, exist_ok=True)
                torch.save(lay, path)
        del gu, dn
        if a.prepare:
            continue
        idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
        w = torch.softmax(torch.randn(T, K, generator=g), -1)
        r = build_routing(idx, E)
        lay["r"] = r
        lay["w_g"] = w.reshape(-1)[r.perm].float().contiguous()
        lay["offs"] = stream._offsets(r)
        lay["x"] = torch.randn(T, H, generator=g).bfloat16()
        lay["gy"] = torch.randn(T, H, generator=g).bfloat16()
        layers.append(lay)
    if a.prepare:
        return
    hit = sum(int((torch.tensor(ly["r"].counts) > 0).sum()) for ly in layers)
    nbytes = {
        "bf16": hit * 3 * H * inter * 2,
        quant.INT8: hit * (3 * H * inter + 4 * (2 * inter + H)),
        quant.FP8: hit * (3 * H * inter + 4 * (2 * inter * H + H * inter) // (128 * 128)),
    }
    sd, sgu = -(-H // 2), -(-2 * inter // 2)

    def run(variant, ly):
        r = ly["r"]
        variant, _, forced = variant.partition("/")
        vcode = kernels.ISA_CODES[forced] if forced else code
        if variant == "bf16":
            gu, dn = ly["bf16"]
            t0 = time.perf_counter()
            out, h = ops.stream_forward(
                ly["x"],
                r.token_idx,
                ly["w_g"],
                ly["offs"],
                gu,
                dn,
                r.inv_perm,
                T,
                K,
                code,
                stream.GU_BLOCK,
                stream.DOWN_BLOCK,
            )
            t1 = time.perf_counter()
            dx, _dw, _ = ops.stream_backward(
                ly["gy"],
                r.token_idx,
                h,
                ly["w_g"],
                ly["offs"],
                gu,
                dn,
                r.inv_perm,
                T,
                K,
                code,
                sd,
                sgu,
            )
            t2 = time.perf_counter()
        else:
            q = ly[variant]
            blk = quant.FORMATS[variant].block
            t0 = time.perf_counter()
            out, h = mod.q8_forward(
                ly["x"],
                r.token_idx,
                ly["w_g"],
                ly["offs"],
                *q,
                r.inv_perm,
                T,
                K,
                blk[0],
                blk[1],
                vcode,
                64,
                256,
            )
            t1 = time.perf_counter()
            dx, _dw, _ = mod.q8_backward(
                ly["gy"],
                r.token_idx,
                h,
                ly["w_g"],
                ly["offs"],
                *q,
                r.inv_perm,
                T,
                K,
                blk[0],
                blk[1],
                vcode,
                sd,
                sgu,
            )
            t2 = time.perf_counter()
        return t1 - t0, t2 - t1, out, dx

    buf = torch.empty(1 << 28)  # 1 GiB fp32, for the read bandwidth
    buf.fill_(1.0)
    variants = ["bf16", quant.INT8, quant.FP8]
    if a.old:
        variants += [f"{quant.INT8}/avx512", f"{quant.FP8}/avx512"]
    nbytes.update({v: nbytes[v.partition("/")[0]] for v in variants})
    rows = []
    errs: dict[str, list] = {v: [] for v in variants[1:]}
    for rnd in range(a.rounds + 1):
        k = rnd % len(variants)
        order = variants[k:] + variants[:k]
        with open("/proc/loadavg") as f:
            rec = {"round": rnd, "load1": f.read().split()[0]}
        t0 = time.perf_counter()
        buf.sum()
        rec["read_GBps"] = buf.numel() * 4 / (time.perf_counter() - t0) / 1e9
        ref = {}
        for v in order:
            fwd = bwd = 0.0
            outs = []
            for ly in layers:
                f, b, out, dx = run(v, ly)
                fwd += f
                bwd += b
                outs.append((out, dx))
            rec[v] = {"fwd_s": fwd, "bwd_s": bwd}
            ref[v] = outs
        if rnd == 0:
            for v in variants[1:]:
                for li, ((o, d), (ob, db)) in enumerate(zip(ref[v], ref["bf16"], strict=True)):
                    e = {}
                    for name, x, y in (("out", o, ob), ("dx", d, db)):
                        diff = x - y
                        e[name] = {
                            "max_rel": float(diff.abs().max() / y.abs().max()),
                            "rms_rel": float(diff.pow(2).mean().sqrt() / y.pow(2).mean().sqrt()),
                        }
                    errs[v].append({"layer": li, **e})
            continue  # round 0: warm-up + errors
        print(json.dumps(rec), flush=True)
        rows.append(rec)
    summ = {
        "isa": isa,
        "T": T,
        "layers": a.layers,
        "hit_experts": hit,
        "bytes": nbytes,
        "threads": torch.get_num_threads(),
        "errors_vs_bf16_kernel": errs,
    }
    for v in variants:
        tot = [r[v]["fwd_s"] + r[v]["bwd_s"] for r in rows]
        summ[v] = {
            "fwd_med_s": statistics.median(r[v]["fwd_s"] for r in rows),
            "bwd_med_s": statistics.median(r[v]["bwd_s"] for r in rows),
            "tot_med_s": statistics.median(tot),
            "GBps_med": statistics.median(2 * nbytes[v] / t / 1e9 for t in tot),
        }
        if v != "bf16":
            summ[v]["ratio_vs_bf16_paired_med"] = statistics.median(
                (r[v]["fwd_s"] + r[v]["bwd_s"]) / (r["bf16"]["fwd_s"] + r["bf16"]["bwd_s"])
                for r in rows
            )
    summ["read_GBps_med"] = statistics.median(r["read_GBps"] for r in rows)
    print("SUMMARY " + json.dumps(summ, indent=1))


if __name__ == "__main__":
    main()
