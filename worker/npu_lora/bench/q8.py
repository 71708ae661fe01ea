"""``+int8`` / ``+fp8`` variants (issue 39): the 8-bit copy of the experts they compute with, its
bytes, the combinations they refuse, and each layer's output and dX error against the engine's own
dtype (the bf16 kernel on a bf16 engine).

The copy is quantised once from the engine's own expert tensors (``models.quant.quantize``, one
expert at a time, as ``npu-lora run`` quantises at load), placed like the engine's own weights
(``moe.pages.place_experts``) and kept for the run; ``VariantRunner.apply`` points the experts
modules at it through the engine's hooks (``engine.hooks.set_experts_tensors``: the parameters'
``.data``, the ``*_scale`` buffers and ``quant_block``) and back to the engine's own tensors for
the other variants, which are never written.

The error (:func:`layer_errors`) is one extra forward and backward of each layer's experts on
a fixed random input (``T`` tokens routed by the layer's own router, a fixed random output
gradient), once with the engine's own weights and once with the 8-bit copy, on the variant's
experts kernel: ``max_rel = max|d| / max|ref|`` and ``rms_rel = rms(d) / rms(ref)`` of the output
and of dX, as ``experiments/q8/q8_kernel_bench.py`` reports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from npu_lora.api.variant import Variant
from npu_lora.engine.hooks import ExpertWeights, Q8Weight, set_experts_tensors
from npu_lora.models import quant
from npu_lora.moe.host_dtype import STREAM

__all__ = ["check_q8", "error_lines", "layer_errors", "q8_copy", "q8_copy_bytes"]


def check_q8(
    engine: Any, own: ExpertWeights, variants: Sequence[Variant], default_impl: str
) -> None:
    """Raise ValueError naming the first ``+int8`` / ``+fp8`` variant that cannot run on
    ``engine`` (whose own expert tensors are ``own``), and why (the parse already refused hot,
    peer, ``+fp32`` and ``+4k``)."""
    for v in variants:
        if v.q8 is None:
            continue
        impl = v.experts_impl or default_impl
        if impl != STREAM:
            raise ValueError(
                f"variant {v.name!r}: 8-bit experts run on the {STREAM} kernel only (this variant "
                f"runs {impl}); write {v.name.partition('@')[0]}@{STREAM} or --experts-impl {STREAM}"
            )
        if getattr(engine.modes, "train_experts", False):
            raise ValueError(
                f"variant {v.name!r}: lora.trainExperts trains the expert weights, which 8-bit "
                "experts hold frozen (no gradient reaches the 8-bit bytes); run it without "
                "trainExperts"
            )
        if own and isinstance(own[0][0], Q8Weight):
            dtype = str(own[0][0].q.dtype).removeprefix("torch.")
            raise ValueError(
                f"variant {v.name!r}: the engine's experts are already 8-bit (moe.hostDtype "
                f"{dtype}); the 8-bit variants quantise a bf16 or fp32 engine's experts: run the "
                "bench with --host-dtype bfloat16"
            )


def q8_copy(own: ExpertWeights, fmt: str) -> ExpertWeights:
    """Per layer an 8-bit copy (``fmt``: ``int8`` / ``float8_e4m3fn``) of the engine's own
    expert tensors, placed as the engine places its own (huge pages where THP is ``madvise``)."""
    from npu_lora.moe.pages import place_experts

    form = quant.FORMATS[fmt]
    out: ExpertWeights = []
    for gu, dn in own:
        if isinstance(gu, Q8Weight) or isinstance(dn, Q8Weight):
            raise ValueError("the engine's experts are already 8-bit")
        (q_gu, s_gu), (q_dn, s_dn) = quant.quantize(gu, form), quant.quantize(dn, form)
        holder = SimpleNamespace(gate_up_proj=q_gu, down_proj=q_dn)
        place_experts([holder])  # replaces the attributes with placed tensors where it can
        out.append(
            (
                Q8Weight(holder.gate_up_proj, s_gu, form.block),
                Q8Weight(holder.down_proj, s_dn, form.block),
            )
        )
    return out


def q8_copy_bytes(own: ExpertWeights, fmt: str) -> int:
    """Bytes of :func:`q8_copy` (one byte a weight plus the fp32 scales), from the shapes."""
    block = quant.FORMATS[fmt].block
    n = 0
    for pair in own:
        for t in pair:
            shape = tuple(t.shape)
            e, sr, sc = quant.scale_shape(shape, block)  # type: ignore[arg-type]
            n += t.numel() + e * sr * sc * 4
    return n


def _pass(experts: torch.nn.Module, x: torch.Tensor, idx, w, gy) -> tuple[torch.Tensor, ...]:
    xi = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        y = experts(xi, idx, w)
        y.backward(gy.to(y.dtype))
    assert xi.grad is not None
    return y.detach().float(), xi.grad.detach().float()


def _rel(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    d = x - ref
    return {
        "max_rel": float(d.abs().max() / ref.abs().max().clamp_min(1e-30)),
        "rms_rel": float(d.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)),
    }


def layer_errors(
    engine: Any,
    own: ExpertWeights,
    q8: ExpertWeights,
    tokens: int,
    seed: int,
    compute: tuple[torch.dtype, torch.dtype],
) -> list[dict[str, Any]]:
    """Per MoE layer the output and dX error of the 8-bit experts ``q8`` against the engine's
    own ``own`` (module docstring), on ``tokens`` random tokens; ``compute``: the activations'
    dtype of (own, 8-bit). Leaves every layer on ``q8``; the caller's next ``apply`` decides."""
    D = int(engine.config.hidden_size)
    rows = []
    with torch.no_grad():
        for li, m in enumerate(engine.mlps):
            g = torch.Generator().manual_seed(seed + 1000 + li)
            x = torch.randn(tokens, D, generator=g)
            gy = torch.randn(tokens, D, generator=g)
            gate_dtype = next(m.gate.parameters()).dtype
            out = m.gate(x.to(gate_dtype))
            w, idx = out[1].detach(), out[2].detach()
            res = []
            for weights, dtype in ((own, compute[0]), (q8, compute[1])):
                set_experts_tensors(m.experts, weights[li])
                res.append(_pass(m.experts, x.to(dtype), idx, w.to(dtype), gy.to(dtype)))
            (o_ref, dx_ref), (o_q, dx_q) = res
            rows.append({"layer": li, "out": _rel(o_q, o_ref), "dx": _rel(dx_q, dx_ref)})
    return rows


def error_lines(errors: Sequence[dict[str, Any]], reference: str) -> list[str]:
    """``bench.md``'s table of the 8-bit variants' per-layer error against ``reference``."""
    if not errors:
        return []
    md = [
        "",
        f"8-bit experts: each layer's error against the engine's own {reference} experts "
        "(relative to the reference's max and RMS; one extra forward/backward per layer):",
        "",
        "| variant | layer | out max | out RMS | dX max | dX RMS |",
        "|---|---|---|---|---|---|",
    ]
    for e in errors:
        o, d = e["out"], e["dx"]
        md.append(
            f"| {e['variant']} | {e['layer']} | {o['max_rel']:.2%} | {o['rms_rel']:.2%} | "
            f"{d['max_rel']:.2%} | {d['rms_rel']:.2%} |"
        )
    return md
