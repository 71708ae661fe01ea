"""The streaming experts kernel on 8-bit frozen weights (``moe.hostDtype: int8 | float8_e4m3fn``;
formats in :mod:`npu_lora.models.quant`).

Same routing, task lists and autograd contract as :class:`npu_lora.moe.stream.StreamExpertsFunction`
(forward: one pass over each hit expert's ``gate_up_proj`` and ``down_proj`` bytes; backward: dX
and the routing-weight gradient, one pass over each again), with the C++ drivers of
``kernels/stream_q8.cpp``: the weights are read as bytes and dequantised in registers (never a
wider copy of an expert in memory). fp32 activations: operands and every accumulation fp32, so
the result is "dequantise to fp32, then matmul" up to fp32 summation order (tested per ISA
instance: ``avx512`` (also what ``avx512bf16`` and ``amx`` run for fp32), ``avx2``, ``base``).
bf16 activations on ``avx512bf16`` / ``amx``: the bytes widened to bf16 and ``vdpbf16ps``, the
activations and dX coefficients rounded to bf16 as the bf16 kernel rounds them, scales applied
in fp32 (``kernels/stream_q8_avx512bf16.cpp``; its error bound in docs/engine.md).
The weights are frozen: no expert weight gradient (``lora.trainExperts`` is refused with an 8-bit
host dtype). Without the extension a torch fallback dequantises one hit expert at a time.
"""

from __future__ import annotations

from typing import Any

import torch

from npu_lora.models.quant import block_of, dequantize
from npu_lora.moe import kernels
from npu_lora.moe import stream_common as _common
from npu_lora.moe.routing import Routing
from npu_lora.moe.stream_common import BWD_SPLITS, DOWN_BLOCK, GU_BLOCK, _activations, _offsets
from npu_lora.moe.threads import kernel_threads


class _Dequantized:
    """8-bit experts seen by the bf16/fp32 torch fallback of :mod:`npu_lora.moe.stream_common`: indexing
    one expert dequantises it to fp32 (one expert at a time, never the whole tensor)."""

    def __init__(self, q: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> None:
        self.q, self.s, self.block = q, s, block
        self.shape = q.shape

    def __getitem__(self, e: int) -> torch.Tensor:
        return dequantize(self.q[e], self.s[e], self.block)


def _torch_forward(x_g, w_g, r: Routing, q, block):
    q_gu, s_gu, q_dn, s_dn = q
    gu, dn = _Dequantized(q_gu, s_gu, block), _Dequantized(q_dn, s_dn, block)
    return _common._torch_forward(x_g, w_g, r, gu, dn)


def _torch_backward(g_g, h, w_g, r: Routing, q, block):
    q_gu, s_gu, q_dn, s_dn = q
    gu, dn = _Dequantized(q_gu, s_gu, block), _Dequantized(q_dn, s_dn, block)
    return _common._torch_backward(g_g, h, w_g, r, gu, dn)


class StreamQ8ExpertsFunction(torch.autograd.Function):
    """out[t] = Σ_k w[t,k] · down_e(SiLU(gate_e x_t) · up_e x_t) with 8-bit ``gate_e``/``up_e``/
    ``down_e`` (``q * s``); gradients for ``hidden_states`` and ``top_k_weights`` only."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden_states: torch.Tensor,
        top_k_weights: torch.Tensor,
        q_gu: torch.Tensor,
        s_gu: torch.Tensor,
        q_dn: torch.Tensor,
        s_dn: torch.Tensor,
        block: tuple[int, int],
        routing: Routing,
    ) -> torch.Tensor:
        r = routing
        w_g = top_k_weights.detach().reshape(-1)[r.perm].float().contiguous()
        q = (q_gu.detach(), s_gu.float().contiguous(), q_dn.detach(), s_dn.float().contiguous())
        mod, isa = kernels.load(), kernels.isa()
        ctx.offs = None
        if mod is not None and isa is not None:
            offs = _offsets(r)
            hs = _activations(hidden_states)
            with kernel_threads():
                out, h = mod.q8_forward(
                    hs, r.token_idx, w_g, offs, q[0], q[1], q[2], q[3], r.inv_perm,
                    r.num_tokens, r.top_k, block[0], block[1], kernels.ISA_CODES[isa],
                    GU_BLOCK, DOWN_BLOCK,
                )  # fmt: skip
            ctx.offs = offs
        else:
            x_g = hidden_states.detach().float()[r.token_idx].contiguous()
            with kernel_threads():
                out, h = _torch_forward(x_g, w_g, r, q, block)
        ctx.save_for_backward(top_k_weights, h)
        ctx.q = q
        ctx.block = block
        ctx.routing = r
        ctx.isa = isa
        ctx.x_dtype = hidden_states.dtype
        return out.to(hidden_states.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        top_k_weights, h = ctx.saved_tensors
        r: Routing = ctx.routing
        need_x, need_w = ctx.needs_input_grad[:2]
        w_g = top_k_weights.detach().reshape(-1)[r.perm].float().contiguous()
        q, block = ctx.q, ctx.block
        if ctx.isa is not None and ctx.offs is not None:
            mod = kernels.load()
            g = _activations(grad_out)
            split_d = -(-q[2].shape[1] // BWD_SPLITS)
            split_gu = -(-q[0].shape[1] // BWD_SPLITS)
            with kernel_threads():
                dx, dw, _dh = mod.q8_backward(
                    g, r.token_idx, h, w_g, ctx.offs, q[0], q[1], q[2], q[3], r.inv_perm,
                    r.num_tokens, r.top_k, block[0], block[1], kernels.ISA_CODES[ctx.isa],
                    split_d, split_gu,
                )  # fmt: skip
        else:
            g_g = grad_out.float()[r.token_idx].contiguous()
            with kernel_threads():
                dx, dw, _dh = _torch_backward(g_g, h, w_g, r, q, block)
        grad_x = dx.to(ctx.x_dtype) if need_x else None
        grad_w = dw[r.inv_perm].view_as(top_k_weights).to(top_k_weights.dtype) if need_w else None
        return grad_x, grad_w, None, None, None, None, None, None


def stream_q8_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    experts: torch.nn.Module,
    routing: Routing | None = None,
) -> torch.Tensor:
    """Functional form on a quantised experts module: [T, H] -> [T, H]."""
    from npu_lora.moe.routing import build_routing

    q_gu = experts.gate_up_proj
    routing = routing or build_routing(top_k_index, q_gu.shape[0])
    return StreamQ8ExpertsFunction.apply(
        hidden_states,
        top_k_weights,
        q_gu,
        experts.gate_up_proj_scale,
        experts.down_proj,
        experts.down_proj_scale,
        block_of(experts),
        routing,
    )


__all__ = ["StreamQ8ExpertsFunction", "stream_q8_experts"]
