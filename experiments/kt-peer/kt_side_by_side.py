"""KTransformers kt-kernel AMX SFT experts vs our experts kernels, side by side in ONE process.

    PYTHONPATH=/tmp/kt .venv/bin/python experiments/kt-peer/kt_side_by_side.py \\
        --tokens 128 512 --rounds 5 --out experiments/kt-peer/raw-first

One Qwen3-30B-A3B MoE layer's experts (H=2048, I=768, E=128, top-8, bf16 weights), frozen experts
(backward = dX and the routing-weight gradient), built with ``npu_lora.bench.kernels._module`` /
``_inputs`` (random std-0.02 weights, softmax-top-k routing of random logits, seeded per T).
Kernels timed in one rotation, order reversed on odd rounds, one warm-up round (round 0) first,
per call forward and backward timed separately (``time.perf_counter``), medians reported:

- ``kt_amx``: kt-kernel 0.7.2 ``AMXSFTMoEWrapper`` (method ``AMXBF16_SFT_SkipLoRA`` by default:
  BF16 AMX experts with no LoRA, the frozen-experts case; ``--kt-method AMXBF16_SFT`` adds
  rank-``--kt-lora-rank`` LoRA on every expert, B = 0) called the way KT's own layer does
  (``kt_kernel/sft/layer.py``): ``wrapper.submit_forward(x, ids, w)`` then
  ``KTMoEFunction.apply(...)`` (which syncs the forward; its ``backward`` runs
  ``wrapper.backward`` and returns dX and d(routing weights)). It is registered here as the
  transformers experts implementation ``"kt_amx"`` on the same ``Qwen3MoeExperts`` module, so
  every kernel gets the identical call (``m(x, idx, w)`` then ``y.backward(gy)``, as in
  ``_timed_calls``), the same inputs, routing and weights.
- ``npu_lora_stream`` and ``grouped_mm``: ``cfg._experts_implementation`` on that module
  (``npu_lora.moe.experts.register()`` registers ours, as ``bench_kernels`` does).
- ``copy``: a copy-bandwidth sample per round (``npu_lora.bench.limits.CopyProbe``, buffers of
  half the hit-expert bytes each, allocated once per T, ``measure(repeats=3)``, as
  ``bench.kernels._call_records`` does).

KT weights: ``Qwen3MoeExperts.gate_up_proj`` [E, 2I, H] is ``[gate; up]`` along dim 1
(transformers 5.x: ``gate, up = linear(x, gate_up_proj[e]).chunk(2, -1)``), so KT gets
``gate = gate_up[:, :I]``, ``up = gate_up[:, I:]`` (each [E, I, H]) and ``down_proj`` [E, H, I]
as is (the same split as KT's own ``sft.weights.extract_moe_weights``), all bf16, via
``load_weights_from_tensors``, which pre-packs them into KT's AMX tile layout in C++ (its own copy;
the load time is recorded as ``kt_load_s``).

Threads: ``torch.set_num_threads(--threads)`` (default 2). KT has its own worker pool
(``kt_kernel_ext.CPUInfer``, one per process), configured through the wrapper's
``cpuinfer_threads=--kt-threads`` (default = ``--threads``) and ``threadpool_count=1`` (one
NUMA subpool on node 0; KT pins its first worker to CPU 0). KT's workers spin ~15 ms after each
task before sleeping, so every timed call is preceded by ``--gap-ms`` (default 50) of sleep, for
every kernel, so no kernel runs while another's threads still spin.

Correctness (``--check-tokens``, default 16; ``--check-tokens 0`` skips it): each kernel's output,
dX and d(routing weights) in bf16 vs the transformers eager experts in fp32 on the same
(bf16-rounded) weights and inputs; reported as max |err| / max |reference|.

Outputs in ``--out``: ``kt_side_by_side.jsonl`` (machine facts, check records, one record per
call/copy sample, median rows) and ``kt_side_by_side.md`` (tables).

Install notes: kt-kernel 0.7.2 is installed with ``--no-deps`` in /tmp/kt (add it with
``PYTHONPATH=/tmp/kt`` or ``--kt-path``, appended to ``sys.path``); it pins torch 2.9.1 but its
extensions do not link libtorch and run with our torch. Its only missing import was ``gguf``
(``kt_kernel.utils.loader``), installed with ``pip install --no-deps --target /tmp/kt gguf``. No
``sys.modules`` stubs are needed: ``import kt_kernel.sft`` works as is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from npu_lora.bench.kernels import COPY

KT = "kt_amx"
DEFAULT_IMPLS = (COPY, KT, "npu_lora_stream", "grouped_mm")


def _import_kt(kt_path: str):
    try:
        import kt_kernel
    except ImportError:
        sys.path.append(kt_path)
    import kt_kernel
    from kt_kernel.sft.amx import AMXSFTMoEWrapper
    from kt_kernel.sft.autograd import KTMoEFunction

    return kt_kernel, AMXSFTMoEWrapper, KTMoEFunction


def _kt_forward_factory(KTMoEFunction):
    """A transformers experts forward that runs the KT wrapper attached as ``self._kt``."""

    def kt_amx_experts_forward(self, hidden_states, top_k_index, top_k_weights):
        kt = self._kt
        T, H = hidden_states.shape
        save = torch.is_grad_enabled() and (
            hidden_states.requires_grad or top_k_weights.requires_grad
        )
        # KT's layer passes detached tensors to the C++ submit and the graph-attached ones to
        # the autograd function (kt_kernel/sft/layer.py, single-GPU path).
        kt.submit_forward(
            hidden_states.detach(),
            top_k_index.detach(),
            top_k_weights.detach(),
            save_for_backward=save,
        )
        if not save:
            return kt.sync_forward(output_device=None).to(hidden_states.dtype)
        lora_ref = hidden_states.new_empty((), requires_grad=False)
        y = KTMoEFunction.apply(
            hidden_states.view(1, T, H),
            top_k_index,
            top_k_weights,
            kt,
            lora_ref,
            H,
            top_k_index.shape[-1],
            kt.layer_idx,
            True,
            False,
            None,
        )
        return y.view(T, H)

    return kt_amx_experts_forward


def _build_kt(AMXSFTMoEWrapper, m, a, max_tokens: int) -> tuple[Any, float]:
    E, twoI, H = m.gate_up_proj.shape
    inter = twoI // 2
    kt = AMXSFTMoEWrapper(
        layer_idx=0,
        num_experts=E,
        num_experts_per_tok=a.top_k,
        hidden_size=H,
        moe_intermediate_size=inter,
        num_gpu_experts=0,
        cpuinfer_threads=a.kt_threads or a.threads,
        threadpool_count=1,
        weight_path="",
        chunked_prefill_size=max_tokens,
        lora_rank=a.kt_lora_rank,
        lora_alpha=2.0 * a.kt_lora_rank,
        lora_dropout=0.0,
        max_cache_depth=1,
        method=a.kt_method,
    )
    gu = m.gate_up_proj.detach()
    gate = gu[:, :inter].to(torch.bfloat16).contiguous()
    up = gu[:, inter:].to(torch.bfloat16).contiguous()
    down = m.down_proj.detach().to(torch.bfloat16).contiguous()
    t0 = time.perf_counter()
    kt.load_weights_from_tensors(gate, up, down, torch.arange(E, dtype=torch.int64))
    load_s = time.perf_counter() - t0
    if "SkipLoRA" not in a.kt_method:  # LoRA on: A random, B zero (the output is unchanged)
        r, g = a.kt_lora_rank, torch.Generator().manual_seed(1)
        shapes = [(E, r, H), (E, inter, r), (E, r, H), (E, inter, r), (E, r, inter), (E, H, r)]
        ws = [
            (torch.randn(s, generator=g) * 0.02 if i % 2 == 0 else torch.zeros(s)).to(
                torch.bfloat16
            )
            for i, s in enumerate(shapes)
        ]
        grads = [torch.zeros(s, dtype=torch.bfloat16) for s in shapes]
        kt.init_lora_weights(*ws, *grads)
        kt._bench_lora = (ws, grads)  # keep alive (C++ holds raw pointers)
    return kt, load_s


def _check(m, cfg, impls: list[str], T: int, seed: int, log) -> list[dict]:
    """bf16 kernels vs fp32 eager experts (same bf16-rounded weights and inputs)."""
    from npu_lora.bench.kernels import _inputs, _module

    H, E = m.gate_up_proj.shape[2], m.gate_up_proj.shape[0]
    K = cfg.num_experts_per_tok
    m32, cfg32, _ = _module(H, m.down_proj.shape[2], E, K, torch.float32, False, seed)
    with torch.no_grad():
        m32.gate_up_proj.copy_(m.gate_up_proj.float())
        m32.down_proj.copy_(m.down_proj.float())
    x0, idx, w, gy, _ = _inputs(T, H, E, K, torch.bfloat16, seed)
    cfg32._experts_implementation = "eager"
    xr = x0.float().requires_grad_(True)
    wr = w.float().requires_grad_(True)
    yr = m32(xr, idx, wr)
    yr.backward(gy.float())
    del m32
    recs = []
    for impl in [i for i in impls if i != COPY]:
        cfg._experts_implementation = impl
        x = x0.clone().requires_grad_(True)
        ww = w.clone().requires_grad_(True)
        y = m(x, idx, ww)
        y.backward(gy)
        rec = {"kind": "check", "impl": impl, "T": T, "dtype": "bfloat16", "ref": "eager fp32"}
        for name, got, ref in (("y", y, yr), ("dx", x.grad, xr.grad), ("dw", ww.grad, wr.grad)):
            err = (got.float() - ref).abs().max().item()
            scale = ref.abs().max().item()
            rec[f"{name}_max_abs_err"] = err
            rec[f"{name}_ref_max_abs"] = scale
            rec[f"{name}_rel"] = err / scale
            rec[f"{name}_dtype"] = str(got.dtype).removeprefix("torch.")
        recs.append(rec)
        log(
            f"check T={T} {impl:16s} y {rec['y_rel']:.2e}  dX {rec['dx_rel']:.2e}  "
            f"dw {rec['dw_rel']:.2e}  (max|err| / max|fp32 eager|)"
        )
    return recs


def _git_facts() -> dict:
    def run(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            return None

    return {
        "git_head": run("git", "rev-parse", "HEAD"),
        "git_dirty_kernels": run("git", "status", "--porcelain", "worker/npu_lora/moe/kernels"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--impls", nargs="+", default=list(DEFAULT_IMPLS))
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--kt-threads", type=int, help="KT worker-pool threads (default --threads)")
    p.add_argument("--kt-method", default="AMXBF16_SFT_SkipLoRA")
    p.add_argument("--kt-lora-rank", type=int, default=8, help="only used by LoRA KT methods")
    p.add_argument("--kt-path", default="/tmp/kt")
    p.add_argument("--check-tokens", type=int, default=16, help="0: skip the correctness check")
    p.add_argument("--gap-ms", type=float, default=50.0, help="sleep before every timed call")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="experiments/kt-peer/raw")
    a = p.parse_args(argv)

    def log(s):
        print(s, flush=True)

    torch.set_num_threads(a.threads)
    kt_kernel, AMXSFTMoEWrapper, KTMoEFunction = _import_kt(a.kt_path)
    from npu_lora.bench.kernels import _inputs, _median_row, _module, _timed_calls
    from npu_lora.bench.limits import CopyProbe, stream_bandwidth
    from npu_lora.machine import machine_facts
    from npu_lora.moe import kernels as ext
    from npu_lora.moe import stream
    from npu_lora.moe.experts import expert_bytes, register
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    register()
    if KT not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(KT, _kt_forward_factory(KTMoEFunction))

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    jf = (out / "kt_side_by_side.jsonl").open("w")

    def emit(rec):
        jf.write(json.dumps(rec) + "\n")
        jf.flush()

    H, inter, E, K = a.hidden, a.intermediate, a.experts, a.top_k
    m, cfg, _ = _module(H, inter, E, K, torch.bfloat16, False, a.seed)
    per_expert = expert_bytes(m.gate_up_proj, m.down_proj)
    facts = {
        "kind": "machine",
        **machine_facts(),
        "stream_backend": stream.backend(),
        "stream_ext_digest": ext._digest(),
        **_git_facts(),
        "kt_kernel_version": kt_kernel.__version__,
        "kt_cpu_variant": kt_kernel.__cpu_variant__,
        "kt_method": a.kt_method,
        "kt_threads": a.kt_threads or a.threads,
        "kt_threadpool_count": 1,
        "torch_threads": torch.get_num_threads(),
        "gap_ms": a.gap_ms,
        "argv": sys.argv,
    }
    kt = None
    if KT in a.impls:
        kt, load_s = _build_kt(AMXSFTMoEWrapper, m, a, max(max(a.tokens), a.check_tokens))
        m._kt = kt
        facts["kt_load_s"] = load_s
        log(f"KT {a.kt_method}: weights loaded + packed in {load_s:.2f} s")
    emit(facts)
    log(
        f"{facts['cpu_model']}: torch threads {torch.get_num_threads()}, KT threads "
        f"{facts['kt_threads']}, npu_lora_stream {facts['stream_backend']} "
        f"(ext {facts['stream_ext_digest']}), KT {facts['kt_kernel_version']} "
        f"({facts['kt_cpu_variant']})"
    )

    checks = []
    if a.check_tokens:
        checks = _check(m, cfg, a.impls, a.check_tokens, a.seed, log)
        for r in checks:
            emit(r)

    bw = stream_bandwidth(repeats=5)
    emit({"kind": "limits", "when": "before", **bw.to_dict()})
    log(f"copy {bw.copy_gbs:.1f} GB/s, triad {bw.triad_gbs:.1f} GB/s (fresh 384 MiB buffers)")

    kernels_only = [i for i in a.impls if i != COPY]
    base = "grouped_mm" if "grouped_mm" in kernels_only else kernels_only[0]
    rows = []
    for T in a.tokens:
        x0, idx, w, gy, hit = _inputs(T, H, E, K, torch.bfloat16, a.seed)
        where = {"dtype": "bfloat16", "mode": "frozen", "T": T}
        probe = None

        def copy_bw():
            nonlocal probe
            if probe is None:
                probe = CopyProbe(max(hit * per_expert // 8, 1 << 20))  # noqa: B023 (this T only)
            return probe.measure(repeats=3)

        recs = []
        for impl, rnd, f, b, cpu_s in _timed_calls(
            m, cfg, (x0, idx, w, gy), a.impls, a.rounds, copy_bw, a.gap_ms / 1e3
        ):
            if impl == COPY:
                rec = {"kind": "copy", "impl": impl, **where, "round": rnd, "copy_gbs": f}
                rec.update(triad_gbs=b, loadavg=os.getloadavg())
            else:
                rec = {
                    "kind": "call",
                    "impl": impl,
                    **where,
                    "round": rnd,
                    "fwd_s": f,
                    "bwd_s": b,
                    "cpu_s": cpu_s,
                    "hit_experts": hit,
                    "hit_bytes": hit * per_expert,
                    "loadavg": os.getloadavg(),
                }
            recs.append(rec)
            emit(rec)
        del probe
        for impl in kernels_only:
            row = _median_row(recs, impl, base, hit * per_expert, where)
            row["cpu_s_median"] = statistics.median(r["cpu_s"] for r in recs if r["impl"] == impl)
            rows.append(row)
            emit(row)
            log(
                f"T={T} {impl:16s} fwd {row['fwd_ms']:8.1f} ms ({row['fwd_ratio_vs_base']:.2f}x) "
                f"bwd {row['bwd_ms']:8.1f} ms ({row['bwd_ratio_vs_base']:.2f}x) "
                f"copy {row.get('copy_gbs', float('nan')):.1f} GB/s"
            )
    bw2 = stream_bandwidth(repeats=5)
    emit({"kind": "limits", "when": "after", **bw2.to_dict()})
    jf.close()

    lines = [
        f"kt-kernel {facts['kt_kernel_version']} `{a.kt_method}` vs npu_lora kernels; one "
        f"Qwen3MoeExperts layer H={H} I={inter} E={E} top-{K}, bf16 weights, frozen experts "
        f"(backward = dX + d routing weights). torch threads {torch.get_num_threads()}, KT pool "
        f"threads {facts['kt_threads']} (1 subpool). Medians of {a.rounds} rounds after 1 "
        f"warm-up, order alternating per round, {a.gap_ms:g} ms sleep before each call. "
        f"npu_lora_stream backend {facts['stream_backend']} (ext {facts['stream_ext_digest']})."
        + (f" KT weight load+pack: {facts['kt_load_s']:.2f} s." if "kt_load_s" in facts else ""),
        "",
        f"Copy bandwidth (fresh buffers): {bw.copy_gbs:.1f} GB/s before, {bw2.copy_gbs:.1f} "
        "GB/s after; `copy GB/s` below is the median of the per-round samples in that T's rotation.",
        "",
    ]
    if checks:
        lines += [
            f"Correctness, T={a.check_tokens}: bf16 kernel vs fp32 eager experts (same "
            "bf16-rounded weights and inputs), max|err| / max|reference|:",
            "",
            "| kernel | out | dX | d routing w |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['impl']} | {r['y_rel']:.2e} | {r['dx_rel']:.2e} | {r['dw_rel']:.2e} |"
            for r in checks
        ]
        lines.append("")
    lines += [
        f"| T | kernel | fwd ms | bwd ms | fwd ÷ {base} | bwd ÷ {base} | CPU s / call | "
        "fwd GB/s (hit experts) | copy GB/s | fwd % of copy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r.get("copy_gbs", bw.copy_gbs)
        lines.append(
            f"| {r['T']} | {r['impl']} | {r['fwd_ms']:.1f} | {r['bwd_ms']:.1f} | "
            f"{r['fwd_ratio_vs_base']:.2f} | {r['bwd_ratio_vs_base']:.2f} | "
            f"{r['cpu_s_median']:.3f} | {r['fwd_gbs']:.1f} | {c:.1f} | {r['fwd_gbs'] / c:.0%} |"
        )
    (out / "kt_side_by_side.md").write_text("\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
