"""Experts-kernel micro-benchmark: one MoE layer's experts, kernels interleaved in one process.

    python -m npu_lora.bench.kernels --tokens 128 512 --dtypes float32 bfloat16 --rounds 6 \\
        --out experiments/raw/2026-11-30-experts-kernel

One ``Qwen3MoeExperts`` module at the given widths (default Qwen3-30B-A3B: H=2048, I=768, E=128,
top-8), random weights (std 0.02) and softmax-top-k routing of random logits (so nearly all
experts are hit). For each (T, dtype): rounds over the kernels, order reversed on odd rounds;
per call the forward and the backward are timed separately (``time.perf_counter``; CPU work is
synchronous). Backward modes: ``frozen`` (LoRA: the experts are frozen; dX and the routing-weight
gradient only) and, with ``--train-experts``, ``train`` (plus both expert weight gradients).
Records: JSONL (one per call) + a markdown table of medians, paired ratios vs ``grouped_mm``, and
the forward's effective bandwidth (hit experts' bytes / forward time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

DEFAULT_IMPLS = ("copy", "grouped_mm", "npu_lora_sorted", "npu_lora_stream")
#: Pseudo-kernel measured in the same rotation as the kernels: ``c[:] = a`` over a buffer of the
#: layer's hit-expert bytes (``limits.stream_bandwidth``; "fwd" is the copy, "bwd" the triad).
COPY = "copy"


def _module(H: int, inter: int, E: int, K: int, dtype: torch.dtype, train: bool, seed: int):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(
        hidden_size=H, moe_intermediate_size=inter, num_experts=E, num_experts_per_tok=K
    )
    cfg._experts_implementation = "eager"
    m = Qwen3MoeExperts(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        m.gate_up_proj.copy_(torch.randn(m.gate_up_proj.shape, generator=g) * 0.02)
        m.down_proj.copy_(torch.randn(m.down_proj.shape, generator=g) * 0.02)
    m = m.to(dtype)
    m.requires_grad_(train)
    from npu_lora.moe.pages import place_experts

    pages = place_experts([m])  # as the engine places them (NPU_LORA_HUGEPAGES=0: not)
    return m, cfg, pages


def _inputs(T: int, H: int, E: int, K: int, dtype: torch.dtype, seed: int) -> tuple:
    """``x0, idx, w, gy`` for ``T`` tokens (seeded per T) and the number of experts hit."""
    g = torch.Generator().manual_seed(seed + T)
    x0 = torch.randn(T, H, generator=g).to(dtype)
    logits = torch.randn(T, E, generator=g)
    w, idx = torch.softmax(logits, -1).topk(K, -1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    gy = torch.randn(T, H, generator=g).to(dtype)
    hit = int((torch.bincount(idx.reshape(-1), minlength=E) > 0).sum())
    return x0, idx, w, gy, hit


@contextlib.contextmanager
def _forced_isa(isa: str) -> Iterator[None]:
    """``npu_lora_stream@<isa>``: the call runs that instruction-set path of the stream kernel
    (``NPU_LORA_STREAM_ISA`` for its duration), so paths are compared in one rotation."""
    if not isa:
        yield
        return
    old = os.environ.get("NPU_LORA_STREAM_ISA")
    os.environ["NPU_LORA_STREAM_ISA"] = isa
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("NPU_LORA_STREAM_ISA", None)
        else:
            os.environ["NPU_LORA_STREAM_ISA"] = old


def _timed_calls(
    m: torch.nn.Module,
    cfg: Any,
    inputs: tuple,
    impls: list[str],
    rounds: int,
    copy_bw: Any = None,
    gap_s: float = 0.0,
) -> Iterator[tuple[str, int, float, float, float]]:
    """Forward + backward per kernel, ``rounds`` rounds (alternating order) after one warm-up
    round; yields ``(impl, round, fwd_s, bwd_s, cpu_s)`` right after each measured call (for
    ``copy``: ``(copy, round, copy_gbs, triad_gbs, 0)``, ``copy_bw()`` the measurement).
    ``gap_s``: a sleep before every call (e.g. KTransformers' workers spin after each task)."""
    x0, idx, w, gy = inputs
    for rnd in range(rounds + 1):  # round 0 is warm-up
        order = impls if rnd % 2 == 0 else impls[::-1]
        for impl in order:
            if gap_s:  # for kernels whose worker threads keep spinning after a call
                time.sleep(gap_s)
            if impl == COPY:
                bw = copy_bw()
                if rnd > 0:
                    yield impl, rnd, bw.copy_gbs, bw.triad_gbs, 0.0
                continue
            name, _, isa = impl.partition("@")
            cfg._experts_implementation = name
            x = x0.clone().requires_grad_(True)
            ww = w.clone().requires_grad_(True)
            m.zero_grad(set_to_none=True)
            with _forced_isa(isa):
                c0 = time.process_time()
                t0 = time.perf_counter()
                y = m(x, idx, ww)
                t1 = time.perf_counter()
                y.backward(gy)
                t2 = time.perf_counter()
                cpu_s = time.process_time() - c0
            del y
            if rnd > 0:
                yield impl, rnd, t1 - t0, t2 - t1, cpu_s


def _call_records(
    jf: Any,
    m: torch.nn.Module,
    cfg: Any,
    inputs: tuple,
    impls: list[str],
    rounds: int,
    where: dict,
    hit: int,
    per_expert: int,
) -> list[dict]:
    """The ``call`` records of one case (written to ``jf`` as measured)."""
    recs: list[dict] = []
    from npu_lora.bench.limits import CopyProbe

    probe = None  # buffers of half the hit bytes each, allocated once per case (if sampled)

    def copy_bw():
        nonlocal probe
        if probe is None:
            probe = CopyProbe(max(hit * per_expert // 8, 1 << 20))
        return probe.measure(repeats=3)

    for impl, rnd, fwd_s, bwd_s, cpu_s in _timed_calls(m, cfg, inputs, impls, rounds, copy_bw):
        if impl == COPY:
            rec = {"kind": "copy", "impl": impl, **where, "round": rnd, "copy_gbs": fwd_s}
            rec.update(triad_gbs=bwd_s, loadavg=os.getloadavg())
            recs.append(rec)
            jf.write(json.dumps(rec) + "\n")
            jf.flush()
            continue
        rec = {
            "kind": "call",
            "impl": impl,
            **where,
            "round": rnd,
            "fwd_s": fwd_s,
            "bwd_s": bwd_s,
            "cpu_s": cpu_s,
            "hit_experts": hit,
            "hit_bytes": hit * per_expert,
            "loadavg": os.getloadavg(),
        }
        recs.append(rec)
        jf.write(json.dumps(rec) + "\n")
        jf.flush()
    return recs


def _median_row(recs: list[dict], impl: str, base: str, hit_bytes: int, where: dict) -> dict:
    """Medians of one kernel's calls and its per-round ratios against ``base``."""
    mine = [r for r in recs if r["impl"] == impl]
    ref = {r["round"]: r for r in recs if r["impl"] == base}
    copies = [r["copy_gbs"] for r in recs if r["impl"] == COPY]
    row = {
        "kind": "median",
        "impl": impl,
        **where,
        "fwd_ms": 1e3 * statistics.median(r["fwd_s"] for r in mine),
        "bwd_ms": 1e3 * statistics.median(r["bwd_s"] for r in mine),
        "fwd_ratio_vs_base": statistics.median(r["fwd_s"] / ref[r["round"]]["fwd_s"] for r in mine),
        "bwd_ratio_vs_base": statistics.median(r["bwd_s"] / ref[r["round"]]["bwd_s"] for r in mine),
        "base": base,
        "hit_bytes": hit_bytes,
        "rounds": len(mine),
        "loadavg_median": statistics.median(r["loadavg"][0] for r in mine),
    }
    row["fwd_gbs"] = row["hit_bytes"] / (row["fwd_ms"] / 1e3) / 1e9
    row["bwd_gbs"] = row["hit_bytes"] / (row["bwd_ms"] / 1e3) / 1e9
    if copies:  # the copy bandwidth measured in this case's rotation
        row["copy_gbs"] = statistics.median(copies)
        # per round against that round's copy sample, then the median over rounds
        by_round = {r["round"]: r["copy_gbs"] for r in recs if r["impl"] == COPY}
        paired = [r for r in mine if r["round"] in by_round]
        for d in ("fwd", "bwd"):
            fr = [hit_bytes / r[f"{d}_s"] / 1e9 / by_round[r["round"]] for r in paired]
            row[f"{d}_of_copy"] = statistics.median(fr) if fr else row[f"{d}_gbs"] / row["copy_gbs"]
    return row


def _table(rows: list[dict], bw: Any, bw2: Any) -> list[str]:
    copy = statistics.median([bw.copy_gbs, bw2.copy_gbs])  # never the better of the two
    lines = [
        f"Copy bandwidth: {bw.copy_gbs:.1f} GB/s before, {bw2.copy_gbs:.1f} GB/s after "
        f"({bw.threads} threads); rows without a rotation sample use their mean, {copy:.1f}.",
        "",
        "Per row, `copy` is the median copy bandwidth measured in that case's rotation; the "
        "% columns are the median over rounds of (hit expert bytes / time) / that round's copy "
        "bandwidth.",
        "",
        "| T | dtype | backward | kernel | fwd ms | bwd ms | fwd ÷ base | bwd ÷ base | fwd GB/s (hit experts) | bwd GB/s | copy GB/s | fwd % of copy | bwd % of copy | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r.get("copy_gbs", copy)
        lines.append(
            f"| {r['T']} | {r['dtype']} | {r['mode']} | {r['impl']} | {r['fwd_ms']:.1f} | {r['bwd_ms']:.1f} | "
            f"{r['fwd_ratio_vs_base']:.2f} | {r['bwd_ratio_vs_base']:.2f} | {r['fwd_gbs']:.1f} | "
            f"{r['bwd_gbs']:.1f} | {c:.1f} | {r.get('fwd_of_copy', r['fwd_gbs'] / c):.0%} | "
            f"{r.get('bwd_of_copy', r['bwd_gbs'] / c):.0%} | "
            f"{r['loadavg_median']:.1f} |"
        )
    return lines


def bench_kernels(
    *,
    tokens: list[int],
    dtypes: list[str],
    impls: list[str],
    rounds: int,
    H: int = 2048,
    inter: int = 768,
    E: int = 128,
    K: int = 8,
    train_experts: bool = False,
    seed: int = 0,
    out: Path,
    log=print,
    bw_elems: int | None = None,
) -> list[dict]:
    from npu_lora.bench.limits import stream_bandwidth
    from npu_lora.moe.experts import expert_bytes, register

    register()
    out.mkdir(parents=True, exist_ok=True)
    jf = (out / "kernels.jsonl").open("w")
    from npu_lora.machine import machine_facts
    from npu_lora.moe import stream

    facts = {"kind": "machine", **machine_facts(), "stream_backend": stream.backend()}
    jf.write(json.dumps(facts) + "\n")
    caps = facts["cpu_capabilities"]
    log(
        f"{facts['cpu_model']}: isa {caps['isa']}, {caps['cores']} cores, "
        f"{caps['numa_nodes']} NUMA node(s), caches {caps['caches']}; "
        f"npu_lora_stream {facts['stream_backend']}; threads {torch.get_num_threads()}"
    )
    bw_kw = {"elems": bw_elems} if bw_elems else {}
    bw = stream_bandwidth(**bw_kw)
    jf.write(json.dumps({"kind": "limits", **bw.to_dict()}) + "\n")
    log(f"copy {bw.copy_gbs:.1f} GB/s triad {bw.triad_gbs:.1f} GB/s load {bw.loadavg}")
    rows = []
    modes = ["frozen", "train"] if train_experts else ["frozen"]
    kernels_only = [i for i in impls if i != COPY]
    base = "grouped_mm" if "grouped_mm" in impls else kernels_only[0]
    for dname in dtypes:
        dtype = getattr(torch, dname)
        for mode in modes:
            m, cfg, m_pages = _module(H, inter, E, K, dtype, mode == "train", seed)
            per_expert = expert_bytes(m.gate_up_proj, m.down_proj)
            pages = {"kind": "pages", "dtype": dname, "mode": mode, **m_pages}
            jf.write(json.dumps(pages) + "\n")
            log(f"{dname} {mode} expert weights: {m_pages}")
            for T in tokens:
                x0, idx, w, gy, hit = _inputs(T, H, E, K, dtype, seed)
                inputs = (x0, idx, w, gy)
                where = {"dtype": dname, "mode": mode, "T": T}
                recs = _call_records(jf, m, cfg, inputs, impls, rounds, where, hit, per_expert)
                for impl in [i for i in impls if i != COPY]:
                    row = _median_row(recs, impl, base, hit * per_expert, where)
                    rows.append(row)
                    jf.write(json.dumps(row) + "\n")
                    log(
                        f"T={T} {dname} {mode} {impl:26s} fwd {row['fwd_ms']:8.1f} ms ({row['fwd_ratio_vs_base']:.2f}x) "
                        f"bwd {row['bwd_ms']:8.1f} ms ({row['bwd_ratio_vs_base']:.2f}x) {row['fwd_gbs']:.1f} GB/s"
                    )
            del m
    bw2 = stream_bandwidth(**bw_kw)
    jf.write(json.dumps({"kind": "limits", "when": "after", **bw2.to_dict()}) + "\n")
    jf.close()
    lines = _table(rows, bw, bw2)
    (out / "kernels.md").write_text("\n".join(lines) + "\n")
    log("\n".join(lines))
    return rows


def bench_dtype_ab(
    *,
    tokens: list[int],
    impl: str,
    rounds: int,
    H: int = 2048,
    inter: int = 768,
    E: int = 128,
    K: int = 8,
    seed: int = 0,
    out: Path,
    log=print,
) -> list[dict]:
    """bf16 vs fp32 storage of one kernel *in the same rotation* (the same weights, rounded to
    bf16 for the bf16 module), with the copy bandwidth: ``[copy, float32, bfloat16]`` per round,
    order reversed on odd rounds; medians and the per-round paired bf16/fp32 ratio of wall and
    CPU time (CPU time is the steadier figure on a shared, oversubscribed machine)."""
    from npu_lora.bench.limits import CopyProbe
    from npu_lora.machine import machine_facts
    from npu_lora.moe import stream
    from npu_lora.moe.experts import expert_bytes, register

    register()
    out.mkdir(parents=True, exist_ok=True)
    jf = (out / "dtype_ab.jsonl").open("w")
    jf.write(json.dumps({"kind": "machine", **machine_facts(), "stream_backend": stream.backend()}))
    jf.write("\n")
    m32, cfg32, pages32 = _module(H, inter, E, K, torch.float32, False, seed)
    m16, cfg16, pages16 = _module(H, inter, E, K, torch.bfloat16, False, seed)
    for dname, pages in (("float32", pages32), ("bfloat16", pages16)):
        jf.write(json.dumps({"kind": "pages", "dtype": dname, **pages}) + "\n")
    cfg32._experts_implementation = cfg16._experts_implementation = impl
    rows = []
    for T in tokens:
        x0, idx, w, gy, hit = _inputs(T, H, E, K, torch.float32, seed)
        recs: dict[str, list[dict]] = {"copy": [], "float32": [], "bfloat16": []}
        probe = CopyProbe(hit * expert_bytes(m32.gate_up_proj, m32.down_proj) // 8)
        for rnd in range(rounds + 1):
            order = ["copy", "float32", "bfloat16"]
            for name in order if rnd % 2 == 0 else order[::-1]:
                if name == "copy":
                    rec = {"copy_gbs": probe.measure(repeats=3).copy_gbs}
                else:
                    m, dt = (m32, torch.float32) if name == "float32" else (m16, torch.bfloat16)
                    x = x0.to(dt).requires_grad_(True)
                    ww = w.to(dt).requires_grad_(True)
                    c0, t0 = time.process_time(), time.perf_counter()
                    y = m(x, idx, ww)
                    t1 = time.perf_counter()
                    y.backward(gy.to(dt))
                    t2 = time.perf_counter()
                    rec = {"fwd_s": t1 - t0, "bwd_s": t2 - t1, "cpu_s": time.process_time() - c0}
                    rec["hit_bytes"] = hit * expert_bytes(m.gate_up_proj, m.down_proj)
                if rnd > 0:
                    rec.update(kind="call", name=name, impl=impl, T=T, round=rnd)
                    rec["loadavg"] = os.getloadavg()
                    recs[name].append(rec)
                    jf.write(json.dumps(rec) + "\n")
                    jf.flush()
        copy = statistics.median(r["copy_gbs"] for r in recs["copy"])
        for name in ("float32", "bfloat16"):
            mine, ref = recs[name], recs["float32"]
            row = {"kind": "median", "impl": impl, "T": T, "dtype": name, "copy_gbs": copy}
            for k in ("fwd_s", "bwd_s", "cpu_s"):
                row[k] = statistics.median(r[k] for r in mine)
                row[f"{k}_vs_fp32"] = statistics.median(
                    a[k] / b[k] for a, b in zip(mine, ref, strict=True)
                )
            hb = mine[0]["hit_bytes"]
            for d in ("fwd", "bwd"):  # per round against that round's copy sample; median
                row[f"{d}_of_copy"] = statistics.median(
                    hb / r[f"{d}_s"] / 1e9 / c["copy_gbs"]
                    for r, c in zip(mine, recs["copy"], strict=True)
                )
            row["load"] = statistics.median(r["loadavg"][0] for r in mine)
            rows.append(row)
            jf.write(json.dumps(row) + "\n")
    jf.close()
    lines = [
        f"`{impl}`, bf16 vs fp32 storage in one rotation (ratios: per-round paired medians).",
        "",
        "| T | storage | fwd ms | bwd ms | CPU s | fwd ÷ fp32 | bwd ÷ fp32 | CPU ÷ fp32 | copy GB/s | fwd % of copy | bwd % of copy | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['T']} | {r['dtype']} | {1e3 * r['fwd_s']:.0f} | {1e3 * r['bwd_s']:.0f} | "
            f"{r['cpu_s']:.2f} | {r['fwd_s_vs_fp32']:.2f} | {r['bwd_s_vs_fp32']:.2f} | "
            f"{r['cpu_s_vs_fp32']:.2f} | {r['copy_gbs']:.1f} | {r['fwd_of_copy']:.0%} | "
            f"{r['bwd_of_copy']:.0%} | {r['load']:.1f} |"
        )
    (out / "dtype_ab.md").write_text("\n".join(lines) + "\n")
    log("\n".join(lines))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument(
        "--impls",
        nargs="+",
        default=list(DEFAULT_IMPLS),
        help="kernels (moe.expertsKernel names) and copy; npu_lora_stream@<isa> runs that "
        "instruction-set path of the stream kernel (e.g. npu_lora_stream@avx512bf16)",
    )
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument(
        "--train-experts", action="store_true", help="also time backward with expert weight grads"
    )
    p.add_argument("--threads", type=int)
    p.add_argument("--out", default="bench-kernels")
    p.add_argument(
        "--dtype-ab",
        metavar="KERNEL",
        help="instead: bf16 vs fp32 storage of KERNEL interleaved in one rotation",
    )
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.dtype_ab:
        bench_dtype_ab(
            tokens=a.tokens,
            impl=a.dtype_ab,
            rounds=a.rounds,
            H=a.hidden,
            inter=a.intermediate,
            E=a.experts,
            K=a.top_k,
            out=Path(a.out),
            log=lambda s: print(s, flush=True),
        )
        return 0
    bench_kernels(
        tokens=a.tokens,
        dtypes=a.dtypes,
        impls=a.impls,
        rounds=a.rounds,
        H=a.hidden,
        inter=a.intermediate,
        E=a.experts,
        K=a.top_k,
        train_experts=a.train_experts,
        out=Path(a.out),
        log=lambda s: print(s, flush=True),
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
