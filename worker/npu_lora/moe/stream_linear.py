"""The streaming kernel for one frozen dense weight on a few rows: the ``cpu`` backend's LM head.

The engine computes the LM head only at the label positions (``DeviceHead``): at Qwen3-30B-A3B
widths that is ``x_ND @ W_VDᵀ`` with N = the answer tokens of a micro-batch (8 in ``npu-lora
bench``) against a 151936 x 2048 weight, 1.24 GB in fp32. That is the experts' problem again, a
skinny GEMM bound by how fast the weight streams, and torch's ``mm`` reads it at 9 GB/s forward
and 14 GB/s backward on a 2-core Xeon where the stream kernel's micro-kernels read it at 21-23 GB/s
(experiments/2026-12-02-stream-head.md). On an accelerator backend the head stays on the device;
only the ``cpu`` backend (the host standing in for the device) uses this.

Legend: N rows (label positions), D = C columns (hidden), V = R rows of the weight (vocabulary).

:class:`StreamLinearFunction` (``torch.autograd.Function``), ``W`` frozen::

    forward   y_NV  = x_ND W_VDᵀ                  (one pass over W; row blocks of W as tasks)
    backward  dx_ND = dy_NV W_VD                  (one pass over W; ``SPLITS`` row blocks, one
                                                   fp32 partial [N, D] each, summed in order)

Saved for backward: ``W`` (a reference; no activation is saved, the weight is frozen). Work
buffers: the rows of ``x`` converted once (N·D), the backward's partials (SPLITS·N·D fp32: 4 MB
at N=8). Numerics as the experts kernel's: fp32 weights on fp32 operands; bf16 weights on bf16
operands with fp32 accumulation; a fixed summation order, so results are bitwise the same across
runs and thread counts (tested). Against ``F.linear`` the results differ by the summation order
only (fp32: ~1e-6 of scale).

:func:`frozen_linear` uses the kernel where it was measured faster than ``F.linear`` (at most
``MAX_ROWS`` rows, a frozen 2-D contiguous fp32/bf16 weight, the extension built) and is
``F.linear`` everywhere else; ``NPU_LORA_STREAM_HEAD=0`` turns it off.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

from npu_lora.api.backends import is_host
from npu_lora.moe import kernels
from npu_lora.moe.kernels import ops

#: Most rows (N) the kernel takes: measured on the 2-core AMX Xeon against torch's ``mm`` at the
#: head's shape, fp32 weights: N=8 fwd 54 vs 135 ms, bwd 58 vs 88 ms; N=16 71 vs 129, 81 vs 105;
#: N=32 112 vs 154 but bwd 135 vs 136 (two cores' fp32 FMAs become the bound;
#: experiments/2026-12-02-stream-head.md §3).
MAX_ROWS = 16
FWD_BLOCK = 256  # forward: weight rows per task
SPLITS = 64  # backward: the weight's rows in this many blocks (partials, fixed order)


def _block(rows: int) -> int:
    """Rows of W per backward partial: SPLITS blocks, a multiple of 32 (the AMX axpy's step)."""
    per = -(-rows // SPLITS)
    return (per + 31) // 32 * 32


class StreamLinearFunction(torch.autograd.Function):
    """``y = x Wᵀ`` for a frozen ``W``; see the module docstring."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        mod, isa = kernels.load(), kernels.isa()
        if mod is None or isa is None:
            raise RuntimeError("StreamLinearFunction needs the npu_lora_stream extension")
        x_ND = x.detach().reshape(-1, x.shape[-1]).contiguous()
        y = ops.dense_forward(x_ND, weight, kernels.ISA_CODES[isa], FWD_BLOCK)
        ctx.save_for_backward(weight)
        ctx.isa = isa
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor):  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        g_NV = grad_y.reshape(-1, weight.shape[0])
        if g_NV.dtype not in (torch.float32, torch.bfloat16):
            g_NV = g_NV.float()
        dx = ops.dense_backward(
            g_NV.contiguous(), weight, kernels.ISA_CODES[ctx.isa], _block(weight.shape[0])
        )
        return dx.to(ctx.x_dtype).reshape(ctx.x_shape), None


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`frozen_linear` runs the kernel for these operands."""
    return (
        os.environ.get("NPU_LORA_STREAM_HEAD", "1") != "0"
        and not weight.requires_grad
        and weight.dim() == 2
        and weight.is_contiguous()
        and weight.device.type == "cpu"
        and x.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and x.dtype == weight.dtype
        and x.shape[-1] == weight.shape[1]
        and x.numel() // max(x.shape[-1], 1) <= MAX_ROWS
        and kernels.load() is not None
    )


def frozen_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` (no bias) for a frozen weight: the streaming kernel where it was
    measured faster (:func:`usable`), else ``F.linear`` itself."""
    if usable(x, weight):
        return StreamLinearFunction.apply(x, weight)
    return F.linear(x, weight)


def head_linear(backend: Any) -> Any:
    """How the frozen LM head computes ``x Wᵀ`` on ``backend`` (``DeviceHead(linear=...)``): this
    streaming kernel where the host is the device (a registry entry with ``host``: ``cpu``), else
    the backend's own (``Backend.frozen_linear``; ``None``: the module's forward)."""
    if is_host(backend.name):
        return frozen_linear
    return backend.frozen_linear()
