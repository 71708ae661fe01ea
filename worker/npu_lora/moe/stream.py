"""Streaming host experts kernel (``"npu_lora_stream"``): each hit expert's weights read once per
direction, parallel across experts, fp32 accumulation; bf16 storage computes on bf16 operands,
natively where the CPU has AVX512-BF16 and widened to fp32 in registers on every other x86-64 CPU
(AVX-512, AVX2, baseline).

Legend (shape suffixes)::

    T tokens   K experts per token   S = T·K (token, slot) rows, sorted by expert
    E experts  H hidden size         I expert intermediate size

Weights are used in the layout transformers stores them (``gate_up_proj`` [E, 2I, H],
``down_proj`` [E, H, I], row-major, fp32 or bf16): for the row-streaming micro-kernels that layout
*is* the packed layout (each output row of the forward is one contiguous weight row; each weight
row of the backward is one contiguous axpy source), so nothing is re-packed or copied, ever, and
bf16 storage streams half the bytes of fp32.

:class:`StreamExpertsFunction` (``torch.autograd.Function``), with ``e = idx[t,k]``,
``W_g, W_u`` the gate and up halves of ``gate_up_proj[e]``, ``W_d = down_proj[e]``::

    forward   h_S2I  = [x_t W_gᵀ, x_t W_uᵀ]                 (one pass over gate_up_proj[e])
              a_SI   = SiLU(h_g) · h_u
              out_TH = Σ_k w[t,k] · a W_dᵀ                   (one pass over down_proj[e])
    backward  z_SI   = dout_t W_d                             (one pass over down_proj[e])
              dw[t,k] = <a, z>                                (routing-weight gradient)
              dh_S2I = [w z · h_u · SiLU'(h_g), w z · SiLU(h_g)]
              dx_TH  = Σ_k dh [W_g; W_u]                      (one pass over gate_up_proj[e])
              dW_gu[e] = dh_segᵀ x_seg, dW_d[e] = (w·dout)_segᵀ a_seg   only under trainExperts
                                                              (torch ``mm`` per hit expert)

Numerics: fp32 weights compute on fp32 operands. bf16 weights compute on bf16 operands: the
gathered hidden states and the SiLU·mul activations are rounded to bf16 (what a bf16 model holds
anyway; the hidden states of a bf16 block already are bf16), products are accumulated in fp32,
as torch's bf16 matmul and the AMX / AVX512-BF16 instructions do; ``h``, the gradients and every
reduction are fp32. Two bf16 paths:

- widening ISAs (AVX2, AVX-512 without BF16, baseline): the weights are widened in registers and
  run the fp32 tiles in the fp32 order, so given bf16-valued inputs ``h`` and the whole backward
  are bitwise those of the fp32 path on the widened weights (tested);
- native ISAs: ``avx512bf16`` (AVX512-BF16, e.g. Zen 4): ``vdpbf16ps`` dot products on bf16
  words; ``amx`` (AMX-BF16 tiles, Sapphire Rapids and later; chosen over ``avx512bf16`` where
  Linux grants the tile state): ``tdpbf16ps`` on 16 x 32 bf16 tiles, the tokens packed in VNNI
  blocks of 16, the weights read as stored (forward) or interleaved row pairs in an L1 buffer
  (backward), SiLU·mul and the backward's elementwise part vectorised (a polynomial ``exp``,
  relative error ≤ 2e-7). In the backward the coefficients of the two weight passes (``dout``
  and ``dh``) are rounded to bf16 as a bf16 model's backward holds them (``dh`` itself, ``z``,
  ``dw``, ``dx`` stay fp32): ``dx`` differs from the widening path by ~2^-9 of its scale (tested
  bound 1 %).

Against the fp32 reference of the same weights every path is within 2 % of each tensor's scale
(tested).

Saved for backward: the input ``x`` [T, H] (referenced, not copied), the fp32 pre-activations
``h`` [S, 2I] (= 4·T·K·2I bytes: 50 MB at T=1024, K=8, I=768), the routing. Work buffers per call
(64-byte aligned, rows padded by one cache line so that no two rows sit a multiple of 4 KiB
apart): forward the gathered ``x`` and ``a`` (S·H and S·I fp32, bf16-rounded for bf16 weights;
bf16 words on the native ISAs, plus on ``amx`` both again in VNNI blocks of 16 tokens) and ``y``
[S, H] fp32; backward the gathered ``dout`` [S, H] fp32 (bf16 on the native ISAs, plus a bf16
copy of ``dh``), ``BWD_SPLITS`` partial sums of ``z`` and
``dx`` (2·S·I and 2·S·H fp32) and ``dh`` [S, 2I]. The work buffers and the output tensors come
from the extension's process-wide block cache (``NPU_LORA_STREAM_POOL_MB``, default 4096 MB;
``kernels.load().trim_workspace()`` frees it): freshly mapped blocks would be page-faulted in on
every call.

Compute is the C++ extension (:mod:`npu_lora.moe.kernels`, the drivers in ``stream_core.h``):
per phase a list of (hit expert, row block) tasks that depends only on the shapes and the routing
(never threads inside an expert's 8-row GEMM); torch's intra-op threads take tasks from a shared
counter, largest first; each output element is written by one task and the partial sums and the K
slots are summed in a fixed order, so results are bitwise equal across runs and thread counts.
From ``NPU_LORA_STREAM_BLOCK_TOKENS`` rows an expert (default 10, i.e. T ≳ 160 at Qwen3 widths)
the native bf16 backward (``avx512bf16``) packs weight panels into L1 (the next panel's rows
prefetched) and keeps the out tiles in registers, with bitwise the streaming kernel's results
(``docs/kernels.md``).
Without the extension (it did not build, or ``NPU_LORA_STREAM_EXT=0``) the same Function runs a
pure-torch per-expert loop in fp32 (bf16 weights are widened per expert, so even the fallback
never computes in bf16 on a CPU without native bf16).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from npu_lora.moe import kernels
from npu_lora.moe.kernels import ops
from npu_lora.moe.routing import Routing, build_routing, check_module
from npu_lora.moe.stream_common import (
    BWD_SPLITS,
    DOWN_BLOCK,
    GU_BLOCK,
    _activations,
    _offsets,
    _torch_backward,
    _torch_forward,
)
from npu_lora.moe.threads import kernel_threads

NAME = "npu_lora_stream"


def backend() -> str:
    """``"cpp:<isa>"`` when the extension runs, ``"torch"`` for the fallback."""
    isa = kernels.isa()
    return f"cpp:{isa}" if isa is not None else "torch"


def _weights(t: torch.Tensor) -> torch.Tensor:
    if t.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"{NAME}: expert weights must be float32 or bfloat16, got {t.dtype}")
    return t.detach() if t.is_contiguous() else t.detach().contiguous()


class StreamExpertsFunction(torch.autograd.Function):
    """out[t] = Σ_k w[t,k] · down_e(SiLU(gate_e x_t) · up_e x_t); see the module docstring."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden_states: torch.Tensor,
        top_k_weights: torch.Tensor,
        gate_up_proj: torch.Tensor,
        down_proj: torch.Tensor,
        routing: Routing,
    ) -> torch.Tensor:
        r = routing
        gu, dn = _weights(gate_up_proj), _weights(down_proj)
        w_g = top_k_weights.detach().reshape(-1)[r.perm].float().contiguous()  # [S]
        mod, isa = kernels.load(), kernels.isa()
        if mod is not None and isa is not None:
            offs = _offsets(r)
            hs = _activations(hidden_states)
            with kernel_threads():
                out, h = ops.stream_forward(
                    hs, r.token_idx, w_g, offs, gu, dn, r.inv_perm,
                    r.num_tokens, r.top_k, kernels.ISA_CODES[isa], GU_BLOCK, DOWN_BLOCK,
                )  # fmt: skip
            ctx.offs = offs
        else:
            x_g = hidden_states.detach().float()[r.token_idx].contiguous()  # [S, H]
            with kernel_threads():
                out, h = _torch_forward(x_g, w_g, r, gu, dn)
        ctx.save_for_backward(hidden_states, top_k_weights, gate_up_proj, down_proj, h)
        ctx.routing = r
        ctx.isa = isa
        return out.to(hidden_states.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        hidden_states, top_k_weights, gate_up_proj, down_proj, h = ctx.saved_tensors
        r: Routing = ctx.routing
        need_x, need_w, need_gu, need_down = ctx.needs_input_grad[:4]
        gu, dn = _weights(gate_up_proj), _weights(down_proj)
        w_g = top_k_weights.detach().reshape(-1)[r.perm].float().contiguous()
        g_g = None
        if ctx.isa is not None:
            split_d = -(-dn.shape[1] // BWD_SPLITS)
            split_gu = -(-gu.shape[1] // BWD_SPLITS)
            g = _activations(grad_out)
            with kernel_threads():
                dx, dw, dh = ops.stream_backward(
                    g, r.token_idx, h, w_g, ctx.offs, gu, dn, r.inv_perm,
                    r.num_tokens, r.top_k, kernels.ISA_CODES[ctx.isa], split_d, split_gu,
                )  # fmt: skip
        else:
            g_g = grad_out.float()[r.token_idx].contiguous()  # [S, H]
            with kernel_threads():
                dx, dw, dh = _torch_backward(g_g, h, w_g, r, gu, dn)
        grad_x = dx.to(hidden_states.dtype) if need_x else None
        grad_w = dw[r.inv_perm].view_as(top_k_weights).to(top_k_weights.dtype) if need_w else None
        grad_gu = grad_down = None
        if need_gu or need_down:  # trainExperts: per hit expert torch mm (fp32, then cast)
            x_g = hidden_states.detach().float()[r.token_idx]
            if g_g is None:
                g_g = grad_out.float()[r.token_idx]
            gate, up = h.chunk(2, dim=-1)
            a = F.silu(gate) * up
            gw = g_g * w_g.unsqueeze(-1)
            grad_gu = torch.zeros(gu.shape, dtype=torch.float32) if need_gu else None
            grad_down = torch.zeros(dn.shape, dtype=torch.float32) if need_down else None
            s0 = 0
            with kernel_threads():
                for e, n in enumerate(r.counts):
                    if n:
                        seg = slice(s0, s0 + n)
                        if grad_gu is not None:
                            torch.mm(dh[seg].t(), x_g[seg], out=grad_gu[e])
                        if grad_down is not None:
                            torch.mm(gw[seg].t(), a[seg], out=grad_down[e])
                        s0 += n
            grad_gu = grad_gu.to(gate_up_proj.dtype) if grad_gu is not None else None
            grad_down = grad_down.to(down_proj.dtype) if grad_down is not None else None
        return grad_x, grad_w, grad_gu, grad_down, None


def stream_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """Functional form: [T, H] -> [T, H]."""
    routing = build_routing(top_k_index, gate_up_proj.shape[0])
    return StreamExpertsFunction.apply(
        hidden_states, top_k_weights, gate_up_proj, down_proj, routing
    )


def npu_lora_stream_experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    check_module(self, NAME)
    if self.gate_up_proj.dtype in (torch.int8, torch.float8_e4m3fn):  # moe.hostDtype 8-bit
        from npu_lora.moe.stream_q8 import stream_q8_experts

        return stream_q8_experts(hidden_states, top_k_index, top_k_weights, self)
    return stream_experts(
        hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj
    )


def register() -> list[str]:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(NAME, npu_lora_stream_experts_forward)
    return [NAME]


__all__ = ["NAME", "StreamExpertsFunction", "backend", "register", "stream_experts"]
