"""``npu-lora bench --roofline DIR``: the stream kernel over tokens per pass, on this machine's
roofline (:mod:`npu_lora.moe.roofline`).

    npu-lora bench --roofline docs/roofline --threads 2

Per dtype (fp32, bf16 weights; with ``--roofline-dtypes`` also ``int8`` / ``float8_e4m3fn``: the
bf16 layer quantised, bf16 activations, its bytes counted as held: 1 byte a weight plus the fp32
scales, ``models.quant.expert_nbytes``; their FMA line is the bf16 one, the operands they compute
with) one Qwen3-30B-A3B experts layer (H=2048, I=768, E=128, top-8;
random weights, softmax-top-k routing of random logits: ``bench.kernels``), T = 64 … 2048 tokens
per pass; ``rounds`` rounds, each: the read-only bandwidth (``CopyProbe``, ``a.sum()``), then
every T's forward and backward (frozen experts), order reversed on odd rounds. The FMA peak:
the median GFLOP/s of a 2048³ torch ``mm`` per dtype (the same threads), sampled before and
after. Per (dtype, T): median times, the hit experts' bytes, flops, the measured GFLOP/s, the
bound and the fraction of the roof (floor / measured, per round then median). Writes
``roofline.jsonl``, ``roofline.md`` and ``roofline.png`` (log-log: intensity vs GFLOP/s, the
bandwidth and peak lines, one point per T and direction) and stores the lines for the run summary
(``moe.roofline.save``).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from npu_lora.moe import roofline as rl

TOKENS = (64, 128, 256, 512, 1024, 2048)
DTYPES = ("float32", "bfloat16")
#: 8-bit expert dtypes the sweep accepts (moe.hostDtype names): quantised from the bf16 layer
Q8_DTYPES = ("int8", "float8_e4m3fn")


def _compute_dtype(dname: str) -> torch.dtype:
    """The dtype a sweep dtype's activations (and FMA line) are in: bf16 for 8-bit experts."""
    return torch.bfloat16 if dname in Q8_DTYPES else getattr(torch, dname)


def fma_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of an n³ torch ``mm`` (median of ``repeats`` after one warm-up)."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    xs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        xs.append(2.0 * n**3 / (time.perf_counter() - t0) / 1e9)
    return statistics.median(xs)


def _calls(m: Any, inputs: tuple, K: int) -> tuple[float, float]:
    x0, idx, w, gy = inputs
    x = x0.clone().requires_grad_(True)
    ww = w.clone().requires_grad_(True)
    t0 = time.perf_counter()
    y = m(x, idx, ww)
    t1 = time.perf_counter()
    y.backward(gy)
    return t1 - t0, time.perf_counter() - t1


def run_roofline(
    *,
    out: str | Path,
    threads: int | None = None,
    tokens: tuple[int, ...] = TOKENS,
    dtypes: tuple[str, ...] = DTYPES,
    rounds: int = 3,
    H: int = 2048,
    inter: int = 768,
    E: int = 128,
    K: int = 8,
    seed: int = 0,
    log: Callable[[str], None] = print,
    save_machine: bool = True,
    peak_n: int = 2048,
) -> dict[str, Any]:
    from npu_lora.bench.kernels import _inputs, _module
    from npu_lora.bench.limits import CopyProbe
    from npu_lora.machine import machine_facts
    from npu_lora.models import quant
    from npu_lora.moe.experts import register
    from npu_lora.moe.stream import NAME

    register()
    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jf = (out / "roofline.jsonl").open("w")

    def emit(rec: dict) -> None:
        jf.write(json.dumps(rec, default=str) + "\n")
        jf.flush()

    emit({"kind": "machine", **machine_facts()})
    peaks0 = {d: fma_peak(_compute_dtype(d), peak_n) for d in dtypes}
    probe = CopyProbe()
    reads: list[float] = []
    rows: list[dict[str, Any]] = []
    for dname in dtypes:
        cdt = _compute_dtype(dname)
        m, cfg, _pages = _module(H, inter, E, K, cdt, False, seed)
        cfg._experts_implementation = NAME
        if dname in Q8_DTYPES:
            quant.quantize_experts(m, dname)
        per_e = quant.expert_nbytes(m)  # as held (8-bit: the bytes and the scales)
        ins = {T: _inputs(T, H, E, K, cdt, seed) for T in tokens}
        for T in tokens:  # warm-up
            _calls(m, ins[T][:4], K)
        times: dict[int, list[tuple[float, float, float]]] = {T: [] for T in tokens}
        for rnd in range(rounds):
            rb = probe.measure(repeats=3, read=True).read_gbs
            reads.append(rb)
            for T in tokens if rnd % 2 == 0 else tokens[::-1]:
                f, b = _calls(m, ins[T][:4], K)
                times[T].append((f, b, rb))
                emit({"kind": "call", "dtype": dname, "T": T, "round": rnd, "fwd_s": f,
                      "bwd_s": b, "read_gbs": rb, "loadavg": os.getloadavg()})  # fmt: skip
        for T in tokens:
            hit = ins[T][4]
            nbytes, flops = hit * per_e, rl.pass_flops(T, K, H, inter)
            row: dict[str, Any] = {"kind": "row", "dtype": dname, "T": T, "hit": hit,
                                   "bytes": nbytes, "flops": flops}  # fmt: skip
            for i, d in enumerate(("fwd", "bwd")):
                ts = [c[i] for c in times[T]]
                row[f"{d}_s"] = statistics.median(ts)
                row[f"{d}_gflops"] = flops / row[f"{d}_s"] / 1e9
                fr = [
                    rl.bound(c[i], flops, nbytes, rl.Machine(c[2], peaks0, 0), dname)["of_roof"]
                    for c in times[T]
                ]
                row[f"{d}_of_roof"] = statistics.median(fr)
            rows.append(row)
            emit(row)
        del m
    peaks1 = {d: fma_peak(_compute_dtype(d), peak_n) for d in dtypes}
    machine = rl.Machine(
        read_gbs=statistics.median(reads),
        peak_gflops={d: statistics.median([peaks0[d], peaks1[d]]) for d in dtypes},
        threads=torch.get_num_threads(),
        how=f"read: median of {len(reads)} a.sum() samples; peak: {peak_n}³ torch mm, median of the "
        f"samples before and after the sweep; sweep: median of {rounds} rounds per T",
        sweep={
            "widths": {"H": H, "inter": inter, "E": E, "K": K},
            "seconds": {
                d: {str(r["T"]): r["fwd_s"] + r["bwd_s"] for r in rows if r["dtype"] == d}
                for d in dtypes
            },
        },
    )
    for row in rows:
        row.update(rl.bound(row["fwd_s"], row["flops"], row["bytes"], machine, row["dtype"]))
    emit({"kind": "lines", **machine.to_dict(), "read_samples": reads,
          "peaks_before": peaks0, "peaks_after": peaks1})  # fmt: skip
    jf.close()
    if save_machine:
        log(f"machine lines stored in {rl.save(machine)}")
    lines = _table(rows, machine, H=H, inter=inter, E=E, K=K)
    (out / "roofline.md").write_text("\n".join(lines) + "\n")
    plot(rows, machine, out / "roofline.png")
    log("\n".join(lines))
    return {"machine": machine.to_dict(), "rows": rows}


def _table(rows: list[dict], m: rl.Machine, **w: int) -> list[str]:
    peaks = ", ".join(f"{d} {g:.0f} GFLOP/s" for d, g in m.peak_gflops.items())
    lines = [
        f"Lines: read {m.read_gbs:.1f} GB/s; FMA peak {peaks} ({m.threads} threads; {m.how}).",
        "",
        "| dtype | T | hit | fwd ms | bwd ms | GFLOP/s fwd | bound | bandwidth line ms | FMA line ms | fwd of roof | bwd of roof | tokens/s ×, 2× T |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["dtype"], r["T"]): r for r in rows}
    for r in rows:
        nxt = by.get((r["dtype"], 2 * r["T"]))
        gain = f"{2 * r['fwd_s'] / nxt['fwd_s']:.2f}" if nxt else "—"
        lines.append(
            f"| {r['dtype']} | {r['T']} | {r['hit']} | {1e3 * r['fwd_s']:.1f} | "
            f"{1e3 * r['bwd_s']:.1f} | {r['fwd_gflops']:.0f} | {r['bound']} | "
            f"{1e3 * r['bandwidth_line_s']:.1f} | {1e3 * r['fma_line_s']:.1f} | "
            f"{r['fwd_of_roof']:.0%} | {r['bwd_of_roof']:.0%} | {gain} |"
        )
    lines.append("")
    lines.append(
        "`tokens/s ×, 2× T`: measured forward tokens/s at 2T over that at T (what twice the "
        "tokens per pass gives: a larger micro-batch, or two ranks' tokens in one pass)."
    )
    return lines


def plot(rows: list[dict], m: rl.Machine, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    xs = [r["intensity"] for r in rows]
    lo, hi = min(xs) / 2, max(max(xs), *(g / m.read_gbs for g in m.peak_gflops.values())) * 3
    grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    colors = {"float32": "#4c72b0", "bfloat16": "#dd8452"}
    for d, peak in m.peak_gflops.items():
        ax.plot(grid, [min(peak, x * m.read_gbs) for x in grid], "-", color=colors.get(d, "k"),
                label=f"roof {d}: read {m.read_gbs:.0f} GB/s, peak {peak:.0f} GFLOP/s")  # fmt: skip
    for d in dict.fromkeys(r["dtype"] for r in rows):
        mine = [r for r in rows if r["dtype"] == d]
        for direction, marker in (("fwd", "o"), ("bwd", "x")):
            ax.plot([r["intensity"] for r in mine], [r[f"{direction}_gflops"] if direction == "fwd"
                    else r["flops"] / r["bwd_s"] / 1e9 for r in mine], marker, linestyle="",
                    color=colors.get(d, "k"), label=f"stream kernel {d} {direction}")  # fmt: skip
        for r in mine:
            ax.annotate(str(r["T"]), (r["intensity"], r["fwd_gflops"]), fontsize=7,
                        xytext=(3, -9), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("flops per weight byte read (labels: tokens per pass T)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("host experts kernel roofline (Qwen3-30B-A3B layer, frozen experts)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
