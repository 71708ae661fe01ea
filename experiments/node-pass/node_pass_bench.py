"""Issue 30 item 5: the host MoE of one step with 2 ranks sharing one expert pass, 2 ranks
streaming separately and 1 rank, at Qwen3-30B-A3B widths (E=128, H=2048, I=768, K=8, bf16
weights), 2 layers, S tokens per rank (default 128).

Each variant is one set of long-lived worker processes (``spawn``), all on the same expert
weights in shared memory (one copy); a controller runs the variants in alternating rounds
(the order rotates every round), ``--steps`` steps per round, round 0 is warm-up. A step is what
the engine's host MoE does per micro-batch: every layer's experts forward (the real
``npu_lora_stream`` kernel through the real pass object: ``NodePass`` or ``LocalPass``), then
every layer's backward in reverse order (dx and routing-weight gradients). Not in it: attention,
router, LoRA, optimizer (the device side), so "tokens/s" below is the host MoE's.

Also measured (2 threads): read bandwidth (``CopyProbe.measure(read=True)``) and the kernel's
compute rate at a large pass (T=1024 tokens), the two inputs of the roofline model.

    python experiments/node-pass/node_pass_bench.py --rounds 7 --steps 3 \
        --out experiments/raw/2026-12-03-node-pass/rounds.jsonl
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from typing import Any

import torch
from npu_lora.moe import stream
from npu_lora.moe.node_pass import LocalPass, NodeLink, NodePass
from torch import nn

E, H, I, K, L = 128, 2048, 768, 8, 2  # noqa: E741
CORES = os.cpu_count() or 2


class Experts(nn.Module):
    def __init__(self, gu: torch.Tensor, dn: torch.Tensor) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(gu, requires_grad=False)
        self.down_proj = nn.Parameter(dn, requires_grad=False)

    def forward(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return stream.stream_experts(x, idx, w, self.gate_up_proj, self.down_proj)


def weights() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(L):
        gu = (torch.randn(E, 2 * I, H, generator=g) * 0.02).to(torch.bfloat16).share_memory_()
        dn = (torch.randn(E, H, I, generator=g) * 0.02).to(torch.bfloat16).share_memory_()
        out.append((gu, dn))
    return out


def inputs(rank: int, layer: int, S: int) -> tuple[torch.Tensor, ...]:
    """Router-like routing: top-K of softmax(random logits) per token."""
    g = torch.Generator().manual_seed(1000 * rank + layer)
    x = torch.randn(S, H, generator=g).to(torch.bfloat16)
    probs = torch.softmax(torch.randn(S, E, generator=g), dim=-1)
    w, idx = torch.topk(probs, K, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)
    dy = (torch.randn(S, H, generator=g) * 1e-3).to(torch.bfloat16)
    return x, idx, w, dy


def worker(
    variant: str, rank: int, nranks: int, ws: Any, link: Any, threads: int, S: int, cq: Any, rq: Any
) -> None:
    torch.set_num_threads(threads)
    experts = [Experts(gu, dn) for gu, dn in ws]
    if variant == "shared":
        npass: LocalPass = NodePass(link, rank, nranks, timeout_s=600, threads=CORES)
    else:
        npass = LocalPass()
    npass.active = True
    data = [inputs(rank, layer, S) for layer in range(L)]
    while (steps := cq.get()) is not None:
        for step in range(steps):
            b0 = npass.streamed_bytes
            fwd, bwd, outs = [], [], []
            t0 = time.perf_counter()
            for layer, (x, idx, w, _) in enumerate(data):
                t = time.perf_counter()
                xl, wl = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
                y = npass.module(experts[layer], layer)(xl, idx, wl)
                outs.append((y, xl, wl))
                fwd.append(time.perf_counter() - t)
            for layer in reversed(range(L)):
                t = time.perf_counter()
                y, xl, wl = outs[layer]
                torch.autograd.grad(y, [xl, wl], data[layer][3])
                bwd.insert(0, time.perf_counter() - t)
            rq.put(
                {
                    "variant": variant,
                    "rank": rank,
                    "step": step,
                    "t_start": t0,
                    "total_s": time.perf_counter() - t0,
                    "fwd_s": fwd,
                    "bwd_s": bwd,
                    "bytes": npass.streamed_bytes - b0,
                    "waits": getattr(npass, "waits", 0),
                    "wait_s": getattr(npass, "wait_s", 0.0),
                }
            )


def limits(ws: Any) -> dict[str, float]:
    from npu_lora.bench.limits import CopyProbe

    torch.set_num_threads(CORES)
    bw = CopyProbe(64 * 1024 * 1024, torch.float32).measure(5, read=True)
    ex = Experts(*ws[0])
    T = 1024
    x, idx, w, _ = inputs(7, 0, T)
    with torch.no_grad():
        ex(x, idx, w)
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            ex(x, idx, w)
            ts.append(time.perf_counter() - t)
    flops = 2 * T * K * 3 * H * I
    return {
        "read_gbs": bw.read_gbs,
        "copy_gbs": bw.copy_gbs,
        "kernel_T": T,
        "kernel_fwd_s": statistics.median(ts),
        "kernel_gflops": flops / statistics.median(ts) / 1e9,
    }


def _barrier_worker(link: Any, rank: int, n: int, q: Any) -> None:
    t = time.perf_counter()
    for _ in range(n):
        link.wait(rank, 60)
    q.put((time.perf_counter() - t) / n)


def barrier_us(n: int = 2000) -> float:
    """Seconds of one wait of the pass's barrier between 2 processes (both arriving at once)."""
    ctx = multiprocessing.get_context("spawn")
    link, q = NodeLink.create(ctx, 2), ctx.Queue()
    ps = [ctx.Process(target=_barrier_worker, args=(link, r, n, q)) for r in range(2)]
    for p in ps:
        p.start()
    per = [q.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    return max(per) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("-S", type=int, default=128)
    ap.add_argument("--out", default="rounds.jsonl")
    ap.add_argument("--barrier", action="store_true", help="only time the barrier")
    a = ap.parse_args()
    if a.barrier:
        print(json.dumps({"barrier_us": barrier_us(), "load1": os.getloadavg()[0]}))
        return
    ctx = multiprocessing.get_context("spawn")
    ws = weights()
    link = NodeLink.create(ctx, 2)
    # (ranks, threads per rank): the launcher splits the cores between its ranks
    plan = {"shared": (2, CORES // 2), "separate": (2, CORES // 2), "one": (1, CORES)}
    rq = ctx.Queue()
    procs, cqs = [], {}
    for v, (n, th) in plan.items():
        cqs[v] = []
        for r in range(n):
            cq = ctx.Queue()
            p = ctx.Process(target=worker, args=(v, r, n, ws, link, th, a.S, cq, rq))
            p.start()
            procs.append(p)
            cqs[v].append(cq)
    names = list(plan)
    rows = []
    try:
        for rnd in range(a.rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for v in order:
                load = os.getloadavg()[0]
                for cq in cqs[v]:
                    cq.put(a.steps)
                got = [rq.get(timeout=900) for _ in range(a.steps * plan[v][0])]
                for g in got:
                    g.update(round=rnd, load1=load)
                rows.extend(got)
                print(rnd, v, [round(g["total_s"], 3) for g in got], flush=True)
        lim = limits(ws)
    finally:
        for qs in cqs.values():
            for cq in qs:
                cq.put(None)
        for p in procs:
            p.join(30)
        link.cleanup()
    with open(a.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.write(json.dumps({"limits": lim, "S": a.S, "cores": CORES}) + "\n")
    summarize(rows, lim, a.S)


def summarize(rows: list[dict], lim: dict, S: int) -> None:
    out = {}
    for v in ("shared", "separate", "one"):
        steps: dict[tuple[int, int], list[dict]] = {}
        for r in rows:
            if r["variant"] == v and r["round"] > 0:
                steps.setdefault((r["round"], r["step"]), []).append(r)
        node_s = [max(x["total_s"] for x in g) for g in steps.values()]
        n = len(next(iter(steps.values())))
        med = statistics.median(node_s)
        fwd = statistics.median(max(sum(x["fwd_s"]) for x in g) for g in steps.values()) / L
        bwd = statistics.median(max(sum(x["bwd_s"]) for x in g) for g in steps.values()) / L
        nbytes = statistics.median(sum(x["bytes"] for x in g) for g in steps.values())
        out[v] = {
            "ranks": n,
            "node_step_s": med,
            "host_moe_s_per_layer": med / L,
            "fwd_s_per_layer": fwd,
            "bwd_s_per_layer": bwd,
            "tokens_per_s": n * S / med,
            "us_per_token": med / (n * S) * 1e6,
            "node_expert_bytes": nbytes,
            "samples": len(node_s),
        }
    out["ratio_shared_vs_separate_us_per_token"] = (
        out["shared"]["us_per_token"] / out["separate"]["us_per_token"]
    )
    out["limits"] = lim
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
