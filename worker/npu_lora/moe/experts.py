"""Fast, deterministic host experts kernel for transformers 5.x Qwen3-MoE (``"npu_lora_sorted"``).

transformers 5.x dispatches ``Qwen3MoeExperts.forward(hidden_states [T, H], top_k_index [T, K],
top_k_weights [T, K])`` through ``transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS``. This module
registers one more entry there. What it does, per call:

1. routing bookkeeping under ``no_grad`` (integers only): the T·K (token, slot) pairs are sorted by
   expert with a **stable** sort, so the order inside an expert's group is token order and the
   result is deterministic; group sizes come from ``bincount``; the inverse permutation is built
   once, so every scatter in forward and backward is a *gather* (no ``index_add_`` / ``index_put_``
   with accumulate, whose CPU backward is not deterministic with several threads);
2. one ``torch.autograd.Function`` (:class:`SortedExpertsFunction`) does the math: gather the
   tokens into expert order, fused gate/up projection over contiguous expert segments (either
   ``torch._grouped_mm`` or one ``mm`` per hit expert), SiLU·mul, down projection, weighting by the
   routing weight, inverse-permutation gather and a fixed-order sum over the K slots;
3. its backward is written by hand: it saves only the gate/up pre-activations ``[T·K, 2I]`` (plus the
   input and integer routing tensors it already references) and returns gradients for the hidden
   states, the routing weights (so the router trains / LoRA gradients flow through it) and, only
   when they require grad, both expert weight tensors. The routing-weight gradient uses
   ``dL/dw_s = <a_s, dout_t @ W_down_e>`` (``a`` = SiLU·mul output), so the down-projection output
   ``[T·K, H]`` need not be saved.

Bytes read per call ≈ the hit experts' weights (forward once; backward once more for dX and once
more for the weight gradients when the experts train), which on a CPU makes it bandwidth bound:
see ``npu_lora.bench.limits``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F

from npu_lora.moe.routing import Routing, build_routing, check_module

NAME = "npu_lora_sorted"
#: Variant names: ``NAME`` picks the segment strategy automatically; the suffixed ones force it.
NAME_GROUPED = "npu_lora_sorted_grouped"
NAME_LOOP = "npu_lora_sorted_loop"

Segments = Literal["auto", "grouped", "loop"]


def _has_grouped_mm() -> bool:
    return hasattr(torch, "_grouped_mm")


# --------------------------------------------------------------------------- segment matmuls
# Weight layouts as transformers stores them: gate_up [E, 2I, H], down [E, H, I] ("out, in").


def _seg_linear(
    x: torch.Tensor, w: torch.Tensor, r: Routing, segments: Segments, *, transpose_w: bool = True
) -> torch.Tensor:
    """Per expert segment e: ``x[seg] @ w[e].T`` (transpose_w) or ``x[seg] @ w[e]``."""
    n_out = w.shape[1] if transpose_w else w.shape[2]
    if segments == "grouped":
        wt = w.transpose(-2, -1) if transpose_w else w
        if r.valid == x.shape[0]:
            return torch._grouped_mm(x, wt, offs=r.offsets)
        out = x.new_zeros(x.shape[0], n_out)
        out[: r.valid] = torch._grouped_mm(x[: r.valid], wt, offs=r.offsets)
        return out
    out = (
        x.new_empty(x.shape[0], n_out) if r.valid == x.shape[0] else x.new_zeros(x.shape[0], n_out)
    )
    start = 0
    for e, n in enumerate(r.counts):
        if n:
            we = w[e].t() if transpose_w else w[e]
            torch.mm(x[start : start + n], we, out=out[start : start + n])
            start += n
    return out


def _seg_weight_grad(
    a: torch.Tensor, b: torch.Tensor, r: Routing, segments: Segments, num_experts: int
) -> torch.Tensor:
    """Per expert segment e: ``a[seg].T @ b[seg]`` -> [E, a.shape[1], b.shape[1]] (zeros for unhit)."""
    if segments == "grouped":
        return torch._grouped_mm(a[: r.valid].t(), b[: r.valid], offs=r.offsets)
    out = a.new_zeros(num_experts, a.shape[1], b.shape[1])
    start = 0
    for e, n in enumerate(r.counts):
        if n:
            torch.mm(a[start : start + n].t(), b[start : start + n], out=out[e])
            start += n
    return out


def _grouped_ok(gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> bool:
    """``torch._grouped_mm`` on the CPU needs 16-byte aligned strides and data pointers."""
    if not _has_grouped_mm():
        return False
    esz = gate_up_proj.element_size()
    widths = (gate_up_proj.shape[1], gate_up_proj.shape[2], down_proj.shape[1], down_proj.shape[2])
    return all(w * esz % 16 == 0 for w in widths) and all(
        t.data_ptr() % 16 == 0 for t in (gate_up_proj, down_proj)
    )


def _resolve_segments(
    segments: Segments, gate_up_proj: torch.Tensor, down_proj: torch.Tensor
) -> Segments:
    if segments == "loop" or not _grouped_ok(gate_up_proj, down_proj):
        return "loop"
    # "auto" and "grouped": measured on the 2-core AMX host (experiments/2026-11-30-experts-
    # kernel.md) grouped is at least as fast as the per-expert loop (whose backward pays a thread
    # barrier per small GEMM).
    return "grouped"


class SortedExpertsFunction(torch.autograd.Function):
    """out[t] = Σ_k w[t,k] · down_e(SiLU(gate_e x_t) · up_e x_t), e = index[t,k]; hand-written backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden_states: torch.Tensor,
        top_k_weights: torch.Tensor,
        gate_up_proj: torch.Tensor,
        down_proj: torch.Tensor,
        routing: Routing,
        segments: Segments,
    ) -> torch.Tensor:
        wdtype = gate_up_proj.dtype
        x_g = hidden_states.to(wdtype)[routing.token_idx]  # [S, H] expert order
        w_g = top_k_weights.reshape(-1)[routing.perm].to(wdtype)  # [S]
        h = _seg_linear(x_g, gate_up_proj, routing, segments)  # [S, 2I]
        gate, up = h.chunk(2, dim=-1)
        a = F.silu(gate) * up  # [S, I]
        y = _seg_linear(a, down_proj, routing, segments)  # [S, H]
        y.mul_(w_g.unsqueeze(-1))
        out = y[routing.inv_perm].view(routing.num_tokens, routing.top_k, -1).sum(dim=1)
        ctx.save_for_backward(hidden_states, top_k_weights, gate_up_proj, down_proj, h)
        ctx.routing = routing
        ctx.segments = segments
        return out.to(hidden_states.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        hidden_states, top_k_weights, gate_up_proj, down_proj, h = ctx.saved_tensors
        r: Routing = ctx.routing
        seg: Segments = ctx.segments
        wdtype = gate_up_proj.dtype
        need_x, need_w, need_gu, need_down = ctx.needs_input_grad[:4]
        num_experts = gate_up_proj.shape[0]

        g_g = grad_out.to(wdtype)[r.token_idx]  # [S, H] dL/d(out) per (token, slot), expert order
        w_g = top_k_weights.reshape(-1)[r.perm].to(wdtype)
        gate, up = h.chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        silu = gate * sig
        a = silu * up  # [S, I]
        z = _seg_linear(g_g, down_proj, r, seg, transpose_w=False)  # [S, I] = g @ W_down_e

        grad_w = None
        if need_w:
            dw_g = (a * z).sum(dim=-1)  # [S]
            if r.valid < dw_g.shape[0]:
                dw_g[r.valid :] = 0
            grad_w = dw_g[r.inv_perm].view_as(top_k_weights).to(top_k_weights.dtype)

        grad_down = None
        if need_down:
            grad_down = _seg_weight_grad(g_g * w_g.unsqueeze(-1), a, r, seg, num_experts)

        if not (need_x or need_gu):
            return None, grad_w, None, grad_down, None, None

        da = z.mul_(w_g.unsqueeze(-1))  # [S, I] dL/da
        dgate = da * up * (sig * (1 + gate * (1 - sig)))
        dup = da * silu
        dh = torch.cat([dgate, dup], dim=-1)  # [S, 2I]

        grad_x = None
        if need_x:
            dx_g = _seg_linear(dh, gate_up_proj, r, seg, transpose_w=False)  # [S, H]
            if r.valid < dx_g.shape[0]:
                dx_g[r.valid :] = 0
            grad_x = (
                dx_g[r.inv_perm].view(r.num_tokens, r.top_k, -1).sum(dim=1).to(hidden_states.dtype)
            )
        grad_gu = None
        if need_gu:
            x_g = hidden_states.to(wdtype)[r.token_idx]
            grad_gu = _seg_weight_grad(dh, x_g, r, seg, num_experts)
        return grad_x, grad_w, grad_gu, grad_down, None, None


def sorted_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    *,
    segments: Segments = "auto",
) -> torch.Tensor:
    """Functional form (no module): [T, H] -> [T, H]."""
    routing = build_routing(top_k_index, gate_up_proj.shape[0])
    seg = _resolve_segments(segments, gate_up_proj, down_proj)
    return SortedExpertsFunction.apply(
        hidden_states, top_k_weights, gate_up_proj, down_proj, routing, seg
    )


def _make_forward(segments: Segments):
    def experts_forward(
        self: torch.nn.Module,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
    ) -> torch.Tensor:
        check_module(self, NAME)
        return sorted_experts(
            hidden_states,
            top_k_index,
            top_k_weights,
            self.gate_up_proj,
            self.down_proj,
            segments=segments,
        )

    experts_forward.__name__ = f"npu_lora_sorted_{segments}_experts_forward"
    return experts_forward


npu_lora_sorted_experts_forward = _make_forward("auto")


def register() -> list[str]:
    """Register the kernels in ``ALL_EXPERTS_FUNCTIONS`` (idempotent); returns the names."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    fns = {
        NAME: npu_lora_sorted_experts_forward,
        NAME_GROUPED: _make_forward("grouped"),
        NAME_LOOP: _make_forward("loop"),
    }
    for name, fn in fns.items():
        if name not in ALL_EXPERTS_FUNCTIONS:
            ALL_EXPERTS_FUNCTIONS.register(name, fn)
    from npu_lora.moe import stream

    return [*fns, *stream.register()]


def expert_bytes(gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> int:
    """Bytes of one expert's weights (gate/up + down) in their stored dtype."""
    return (gate_up_proj[0].numel() + down_proj[0].numel()) * gate_up_proj.element_size()


def hit_expert_bytes(
    top_k_index: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    per_expert: int | None = None,
) -> int:
    """Bytes of expert weights one forward must read: only the experts that tokens hit
    (``per_expert``: one expert's bytes, default :func:`expert_bytes`; 8-bit experts pass
    ``models.quant.expert_nbytes``, the bytes plus their scales)."""
    num_experts = gate_up_proj.shape[0]
    ids = top_k_index.reshape(-1)
    hit = int((torch.bincount(ids[ids < num_experts], minlength=num_experts) > 0).sum())
    return hit * (per_expert if per_expert is not None else expert_bytes(gate_up_proj, down_proj))
