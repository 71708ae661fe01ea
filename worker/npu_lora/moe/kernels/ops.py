"""The extension's compute entry points as torch operators (``torch.library.custom_op``):
``torch.ops.npu_lora.stream_forward``, ``stream_backward``, ``dense_forward`` and
``dense_backward``.

Registered as operators, they appear by name in ``torch.profiler`` traces and ``torch.compile``
traces them as single opaque nodes (their fake implementations give the output shapes) instead
of breaking the graph. Each calls the pybind function of the extension :func:`kernels.load`
returns; the autograd lives in the ``torch.autograd.Function`` s that call them
(:mod:`npu_lora.moe.stream`, :mod:`npu_lora.moe.stream_linear`), so the operators themselves
have none. Registering needs no build: the extension is loaded on the first call.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npu_lora.moe import kernels

NAMESPACE = "npu_lora"


def _mod():
    mod = kernels.load()
    if mod is None:
        raise RuntimeError(f"npu_lora_stream extension unavailable: {kernels.error()}")
    return mod


@torch.library.custom_op(f"{NAMESPACE}::stream_forward", mutates_args=(), device_types="cpu")
def stream_forward(
    hidden: Tensor,
    token_idx: Tensor,
    wr: Tensor,
    offsets: Tensor,
    w_gu: Tensor,
    w_down: Tensor,
    inv_perm: Tensor,
    T: int,
    K: int,
    isa: int,
    gu_block: int,
    down_block: int,
) -> tuple[Tensor, Tensor]:
    """``(out [T, H] f32, h [T·K, 2I] f32)``: the experts forward (see ``stream.cpp``)."""
    out, h = _mod().forward(
        hidden, token_idx, wr, offsets, w_gu, w_down, inv_perm, T, K, isa, gu_block, down_block
    )
    return out, h


@stream_forward.register_fake
def _(hidden, token_idx, wr, offsets, w_gu, w_down, inv_perm, T, K, isa, gu_block, down_block):
    f32 = torch.float32
    return hidden.new_empty(T, hidden.shape[1], dtype=f32), hidden.new_empty(
        T * K, w_gu.shape[1], dtype=f32
    )


@torch.library.custom_op(f"{NAMESPACE}::stream_backward", mutates_args=(), device_types="cpu")
def stream_backward(
    g: Tensor,
    token_idx: Tensor,
    h: Tensor,
    wr: Tensor,
    offsets: Tensor,
    w_gu: Tensor,
    w_down: Tensor,
    inv_perm: Tensor,
    T: int,
    K: int,
    isa: int,
    down_split: int,
    gu_split: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx [T, H], dw [T·K], dh [T·K, 2I])``, all f32: the frozen experts' backward."""
    dx, dw, dh = _mod().backward(
        g, token_idx, h, wr, offsets, w_gu, w_down, inv_perm, T, K, isa, down_split, gu_split
    )
    return dx, dw, dh


@stream_backward.register_fake
def _(g, token_idx, h, wr, offsets, w_gu, w_down, inv_perm, T, K, isa, down_split, gu_split):
    f32 = torch.float32
    return (
        g.new_empty(T, g.shape[1], dtype=f32),
        g.new_empty(T * K, dtype=f32),
        g.new_empty(T * K, w_gu.shape[1], dtype=f32),
    )


@torch.library.custom_op(f"{NAMESPACE}::dense_forward", mutates_args=(), device_types="cpu")
def dense_forward(x: Tensor, w: Tensor, isa: int, block: int) -> Tensor:
    """``y [N, R] f32 = x Wᵀ`` for a frozen ``W [R, C]``."""
    return _mod().dense_forward(x, w, isa, block)


@dense_forward.register_fake
def _(x, w, isa, block):
    return x.new_empty(x.shape[0], w.shape[0], dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::dense_backward", mutates_args=(), device_types="cpu")
def dense_backward(g: Tensor, w: Tensor, isa: int, block: int) -> Tensor:
    """``dx [N, C] f32 = g W``."""
    return _mod().dense_backward(g, w, isa, block)


@dense_backward.register_fake
def _(g, w, isa, block):
    return g.new_empty(g.shape[0], w.shape[1], dtype=torch.float32)
