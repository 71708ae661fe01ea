"""One layer's host MoE inside the engine against the experts kernel alone on the same tokens.

``engine``: ``HostMLP`` as the engine calls it (``mlp(x)`` through ``HostMLPFunction``, then
``y.backward(dy)``), on layer 0's real block input (captured from one engine step) and a seeded
``dy``. ``kernel``: the stream kernel's two operators (``torch.ops.npu_lora.stream_forward`` /
``stream_backward``) on the same routed tokens: the routing the block's own router gives for that
input (same hit experts), the same weights, threads and compute dtype; nothing else. ``engine
(all threads)``: the engine with every op on all threads (``NPU_LORA_HOST_SMALL_OPS=0``, the path
before ``moe.threads``), for the before/after figures.

Rounds alternate the order; per round the engine's forward and backward are divided by the
kernel's of the same round, and the verdict (``verdicts.judge``, target
:data:`ENGINE_VS_KERNEL`) is the median of these per-round ratios with the rounds on each side
and the rounds disturbed by other processes. ``phases``: one profiled engine call per path
(``torch.profiler``, after the rounds), its CPU time grouped by phase (kernel, router, routing
bookkeeping, casts/copies, rest = Python, autograd and the Function).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from npu_lora.bench import disturbance
from npu_lora.bench.verdicts import judge

#: Target: the engine's host MoE per layer at most this multiple of the kernel alone.
ENGINE_VS_KERNEL = 1.15
PATHS = ("engine", "kernel", "engine (all threads)")
#: torch op names → phase of the host block (anything else: "rest").
PHASES = {
    "kernel": ("npu_lora::stream_forward", "npu_lora::stream_backward"),
    "router": ("aten::mm", "aten::addmm", "aten::_softmax", "aten::_softmax_backward_data",
               "aten::topk", "aten::div", "aten::div_", "aten::sum", "aten::scatter",
               "aten::mul", "aten::neg"),
    "routing": ("aten::sort", "aten::bincount", "aten::cumsum", "aten::arange", "aten::index",
                "aten::index_put_", "aten::floor_divide", "aten::clamp", "aten::lift_fresh",
                "aten::_local_scalar_dense"),
    "casts/copies": ("aten::copy_", "aten::add_", "aten::add", "aten::zero_", "aten::fill_",
                     "aten::zeros", "aten::empty", "aten::empty_strided"),
}  # fmt: skip


def _capture_input(engine: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Layer 0's block input of one engine step (gradients cleared after)."""
    got: dict[str, torch.Tensor] = {}
    hook = engine.mlps[0].register_forward_hook(
        lambda _m, inp, _out: got.setdefault("x", inp[0].detach().clone())
    )
    try:
        engine.forward_backward(batch)
    finally:
        hook.remove()
    for p in engine.adapter.parameters():
        p.grad = None
    return got["x"]


class LayerProbe:
    """The three paths of one layer on one captured input; each call returns (fwd_s, bwd_s)."""

    def __init__(self, engine: Any, x_BSD: torch.Tensor, seed: int = 0) -> None:
        from npu_lora.moe import kernels, stream
        from npu_lora.moe.routing import build_routing

        self.mlp = m = engine.mlps[0]
        self.x0 = x_BSD
        g = torch.Generator().manual_seed(seed + 1)
        self.dy = torch.randn(x_BSD.shape, generator=g).to(x_BSD.dtype)
        with torch.no_grad():
            xc = x_BSD.reshape(-1, x_BSD.shape[-1]).to(m.compute_dtype)
            _, w, idx = m.gate(xc)
        r = build_routing(idx, m.experts.gate_up_proj.shape[0])
        self.routing = r
        self.hit_experts = len(r.hit_experts)
        self.tokens = r.num_tokens
        self._w_g = w.reshape(-1)[r.perm].float().contiguous()
        self._offs = stream._offsets(r)
        self._gu = m.experts.gate_up_proj.detach()
        self._dn = m.experts.down_proj.detach()
        self._isa = kernels.ISA_CODES[kernels.isa() or "base"]
        self._x = xc.contiguous()
        self._g = self.dy.reshape(-1, x_BSD.shape[-1]).to(m.compute_dtype).contiguous()
        self._splits = (
            -(-self._dn.shape[1] // stream.BWD_SPLITS),
            -(-self._gu.shape[1] // stream.BWD_SPLITS),
        )

    def engine(self, small_ops: bool = True) -> tuple[float, float]:
        old = os.environ.get("NPU_LORA_HOST_SMALL_OPS")
        os.environ["NPU_LORA_HOST_SMALL_OPS"] = "1" if small_ops else "0"
        try:
            x = self.x0.clone().requires_grad_(True)
            t0 = time.perf_counter()
            y = self.mlp(x)
            t1 = time.perf_counter()
            y.backward(self.dy)
            t2 = time.perf_counter()
        finally:
            if old is None:
                os.environ.pop("NPU_LORA_HOST_SMALL_OPS", None)
            else:
                os.environ["NPU_LORA_HOST_SMALL_OPS"] = old
        return t1 - t0, t2 - t1

    def kernel(self) -> tuple[float, float]:
        from npu_lora.moe import stream
        from npu_lora.moe.kernels import ops

        r = self.routing
        t0 = time.perf_counter()
        _, h = ops.stream_forward(
            self._x, r.token_idx, self._w_g, self._offs, self._gu, self._dn, r.inv_perm,
            r.num_tokens, r.top_k, self._isa, stream.GU_BLOCK, stream.DOWN_BLOCK,
        )  # fmt: skip
        t1 = time.perf_counter()
        ops.stream_backward(
            self._g, r.token_idx, h, self._w_g, self._offs, self._gu, self._dn, r.inv_perm,
            r.num_tokens, r.top_k, self._isa, *self._splits,
        )  # fmt: skip
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    def call(self, path: str) -> tuple[float, float]:
        if path == "kernel":
            return self.kernel()
        return self.engine(small_ops=path == "engine")

    def phases(self, path: str, calls: int = 3) -> dict[str, float]:
        """Mean CPU ms per call (forward + backward) of each phase, one profiled run."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for _ in range(calls):
                self.call(path)
            wall = time.perf_counter() - t0
        out = dict.fromkeys([*PHASES, "rest"], 0.0)
        names = {op: ph for ph, ops_ in PHASES.items() for op in ops_}
        total = 0.0
        for ev in prof.key_averages():
            ms = ev.self_cpu_time_total / 1e3 / calls
            total += ms
            out[names.get(ev.key, "rest")] += ms
        out["wall"] = 1e3 * wall / calls
        out["cpu_total"] = total
        return out


def supported(engine: Any) -> str | None:
    """Why the probe cannot run on this engine (``None``: it can)."""
    from npu_lora.moe import kernels, stream

    m = engine.mlps[0] if engine.mlps else None
    cfg = getattr(getattr(m, "experts", None), "config", None)
    if m is None or getattr(cfg, "_experts_implementation", None) != stream.NAME:
        return "needs the npu_lora_stream experts kernel"
    if kernels.isa() is None:
        return f"the stream kernel's extension is unavailable ({kernels.error()})"
    if m.hot is not None:
        return "needs host-only placement"
    if m.trainable_params():
        return "needs frozen experts (the kernel alone has no weight gradients)"
    return None


def run_probe(
    engine: Any,
    batch: dict[str, torch.Tensor],
    *,
    rounds: int,
    emit: Callable[[dict], None],
    log: Callable[[str], None],
    seed: int = 0,
    paths: tuple[str, ...] = PATHS,
) -> dict[str, Any]:
    """Warm-up call per path, then ``rounds`` rounds (alternating order); emits one
    ``layer_probe`` record per call and one ``layer_probe_round`` per round; returns the
    summary (per-round ratios, verdicts' inputs, phases)."""
    probe = LayerProbe(engine, _capture_input(engine, batch), seed)
    for p in paths:
        probe.call(p)
    per: dict[str, dict[int, tuple[float, float]]] = {p: {} for p in paths}
    flagged: set[int] = set()
    loads: dict[int, float] = {}
    for rnd in range(rounds):
        order = list(paths) if rnd % 2 == 0 else list(paths)[::-1]
        cpu0 = disturbance.sample()
        for p in order:
            f, b = probe.call(p)
            per[p][rnd] = (f, b)
            emit({"kind": "layer_probe", "path": p, "round": rnd, "fwd_s": f, "bwd_s": b})
        d = disturbance.disturbance(cpu0, disturbance.sample())
        loads[rnd] = os.getloadavg()[0]
        if d.get("disturbed"):
            flagged.add(rnd)
        emit({"kind": "layer_probe_round", "round": rnd, "loadavg1": loads[rnd], **d})
    out: dict[str, Any] = {
        "kind": "layer_probe_summary",
        "tokens": probe.tokens,
        "hit_experts": probe.hit_experts,
        "compute_dtype": str(probe.mlp.compute_dtype).removeprefix("torch."),
        "host_dtype": str(probe.mlp.host_dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "disturbed_rounds": sorted(flagged),
        "loadavg1": [loads[k] for k in sorted(loads)],
        "medians_ms": {
            p: [1e3 * statistics.median(v[i] for v in per[p].values()) for i in (0, 1)]
            for p in paths
        },
    }
    for p in paths:
        if p == "kernel":
            continue
        out[f"ratios {p}"] = {
            d: {k: per[p][k][i] / per["kernel"][k][i] for k in per[p]}
            for i, d in enumerate(("fwd", "bwd"))
        }
    out["phases_ms"] = {p: probe.phases(p) for p in paths}
    emit(out)
    for line in probe_lines(out):
        log(line)
    return out


def probe_lines(summary: dict[str, Any]) -> list[str]:
    """The bench's lines: ``host MoE engine/kernel per layer: fwd x.xx, bwd x.xx`` (per-round
    paired medians), each direction's verdict, the before figure and the phases."""
    ratios = summary.get("ratios engine")
    if not ratios:
        return [f"host MoE engine/kernel per layer: not measured ({summary.get('why', '?')})"]
    dist = summary.get("disturbed_rounds") or []
    v = {d: judge(ratios[d], ENGINE_VS_KERNEL, at_most=True, disturbed=dist) for d in ratios}
    T, hit = summary["tokens"], summary["hit_experts"]
    loads = summary.get("loadavg1") or [math.nan]
    lines = [
        f"host MoE engine/kernel per layer: fwd {v['fwd'].median:.2f}, bwd {v['bwd'].median:.2f} "
        f"(T={T} tokens, {hit} hit experts, {summary['host_dtype']} weights / "
        f"{summary['compute_dtype']} compute, {summary['threads']} threads; per-round paired "
        f"medians over {v['fwd'].n} rounds, load {min(loads):.1f}–{max(loads):.1f})"
    ]
    for d in ("fwd", "bwd"):
        lines.append(v[d].line(f"host MoE engine/kernel {d}"))
    before = summary.get("ratios engine (all threads)")
    if before:
        b = {d: statistics.median(before[d].values()) for d in before}
        lines.append(
            f"before (every op on all threads, NPU_LORA_HOST_SMALL_OPS=0), same rounds: "
            f"fwd {b['fwd']:.2f}, bwd {b['bwd']:.2f}"
        )
    med = summary.get("medians_ms") or {}
    for p, (f, b) in med.items():
        lines.append(f"{p}: median fwd {f:.1f} ms, bwd {b:.1f} ms")
    for p, ph in (summary.get("phases_ms") or {}).items():
        parts = ", ".join(f"{k} {ph[k]:.1f}" for k in (*PHASES, "rest"))
        lines.append(
            f"phases of {p} (CPU ms per fwd+bwd, one profiled run): {parts}; wall {ph['wall']:.1f}"
        )
    return lines


def pass_lines(engine: Any, summary: dict[str, Any]) -> list[str]:
    """Tokens per pass of the probed layer on this machine's roofline (``moe.roofline``; the
    lines ``npu-lora bench --roofline`` measured), with the engine's measured forward."""
    if not summary.get("tokens"):
        return []
    from npu_lora.moe import roofline
    from npu_lora.moe.experts import expert_bytes

    m = engine.mlps[0]
    E, _, H = m.experts.gate_up_proj.shape
    fwd_ms = (summary.get("medians_ms") or {}).get("engine", [None])[0]
    return roofline.tuning_lines(
        int(summary["tokens"]),
        K=int(engine.config.num_experts_per_tok),
        E=int(E),
        H=int(H),
        inter=int(m.experts.down_proj.shape[2]),
        expert_bytes=expert_bytes(m.experts.gate_up_proj, m.experts.down_proj),
        dtype=summary["host_dtype"],
        m=roofline.load(),
        measured_s=fwd_ms / 1e3 if fwd_ms else None,
    )
