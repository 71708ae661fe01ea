"""Frozen experts in 8 bits (``moe.hostDtype: int8 | float8_e4m3fn``): formats, quantisation at
load, dequantisation, and where the bytes and scales live on the experts module.

Formats (:data:`FORMATS`), ``W[e, r, c] = q[e, r, c] * s[e, r // BR, c // BC]``:

- ``int8``: symmetric, per output channel (``BR = 1``, ``BC`` = the whole row): ``s = amax(|W_row|)
  / 127``, ``q = round(W / s)`` in ``[-127, 127]``. Scales ``[E, R, 1]``.
- ``float8_e4m3fn``: FP8 e4m3 (max 448) with 128 x 128 block scales as fine-grained FP8
  checkpoints carry them (``weight_block_size: [128, 128]``, ``weight_scale_inv``): ``s =
  amax(|W_block|) / 448``, ``q = e4m3(W / s)`` (round to nearest even). Scales ``[E, ceil(R/128),
  ceil(C/128)]``. Per-channel FP8 (compressed-tensors ``strategy: channel``) is the same with
  ``BR = 1``, ``BC`` = the row.

On the experts module the 8-bit tensors replace ``gate_up_proj`` / ``down_proj`` (frozen
parameters of dtype ``int8`` / ``float8_e4m3fn``, same shapes) and the scales are buffers
``gate_up_proj_scale`` / ``down_proj_scale`` (fp32); ``experts.quant_block`` holds ``(BR, BC)``
(``BC = 0``: the whole row). The stream kernel (``stream_q8.cpp``) computes on them directly,
dequantising in registers; everything else that needs a wider copy (hot experts copied to the
device, export, the torch fallback) dequantises one expert or a few at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

INT8 = "int8"
FP8 = "float8_e4m3fn"
#: max magnitude of e4m3fn
E4M3_MAX = 448.0
#: FP8 block of fine-grained checkpoints (``weight_block_size``)
FP8_BLOCK = (128, 128)
EXPERT_PARAMS = ("gate_up_proj", "down_proj")


@dataclass(frozen=True)
class Format:
    name: str
    dtype: torch.dtype
    block: tuple[int, int]  # (BR, BC); BC 0 = the whole row
    qmax: float


FORMATS: dict[str, Format] = {
    INT8: Format(INT8, torch.int8, (1, 0), 127.0),
    FP8: Format(FP8, torch.float8_e4m3fn, FP8_BLOCK, E4M3_MAX),
}
Q8_DTYPES = (torch.int8, torch.float8_e4m3fn)


def is_q8_name(name: str) -> bool:
    return name in FORMATS


def is_quantized(experts: nn.Module) -> bool:
    p = getattr(experts, "gate_up_proj", None)
    return isinstance(p, torch.Tensor) and p.dtype in Q8_DTYPES


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int, int]:
    E, R, C = shape
    br, bc = block
    br = br if br > 0 else 1
    bc = bc if bc > 0 else C
    return E, -(-R // br), -(-C // bc)


def _expand(s: torch.Tensor, R: int, C: int, block: tuple[int, int]) -> torch.Tensor:
    """Scales ``[..., SR, SC]`` to ``[..., R, C]`` (one value per element)."""
    br = block[0] if block[0] > 0 else 1
    bc = block[1] if block[1] > 0 else C
    return s.repeat_interleave(br, -2)[..., :R, :].repeat_interleave(bc, -1)[..., :C]


def quantize_expert(w: torch.Tensor, fmt: Format) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert ``[R, C]`` (any float dtype) to ``(q [R, C], s [SR, SC] fp32)``."""
    w = w.detach().float()
    R, C = w.shape
    _, SR, SC = scale_shape((1, R, C), fmt.block)
    br = fmt.block[0] if fmt.block[0] > 0 else 1
    bc = fmt.block[1] if fmt.block[1] > 0 else C
    pad = torch.zeros(SR * br, SC * bc, dtype=torch.float32)
    pad[:R, :C] = w.abs()
    amax = pad.view(SR, br, SC, bc).amax(dim=(1, 3))
    s = amax / fmt.qmax
    safe = torch.where(s > 0, s, torch.ones_like(s))
    x = w / _expand(safe, R, C, fmt.block)
    if fmt.dtype == torch.int8:
        q = x.round().clamp_(-127, 127).to(torch.int8)
    else:
        q = x.clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, s.contiguous()


def quantize(w: torch.Tensor, fmt: Format | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Experts ``[E, R, C]`` to ``(q, s)``, one expert at a time (never a full wider copy)."""
    fmt = FORMATS[fmt] if isinstance(fmt, str) else fmt
    E, R, C = w.shape
    q = torch.empty((E, R, C), dtype=fmt.dtype)
    s = torch.empty(scale_shape((E, R, C), fmt.block), dtype=torch.float32)
    for e in range(E):
        q[e], s[e] = quantize_expert(w[e], fmt)
    return q, s


def dequantize(
    q: torch.Tensor, s: torch.Tensor, block: tuple[int, int], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``q * s`` expanded over its blocks, in ``dtype`` (``q`` [..., R, C], ``s`` [..., SR, SC];
    torch only: the tests' reference, the hot experts' copy, export)."""
    R, C = q.shape[-2:]
    return (q.float() * _expand(s.float(), R, C, block)).to(dtype)


def experts_q8(experts: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_gu, s_gu, q_dn, s_dn)`` of a quantised experts module."""
    return (
        experts.gate_up_proj.detach(),
        experts.gate_up_proj_scale,
        experts.down_proj.detach(),
        experts.down_proj_scale,
    )


def block_of(experts: nn.Module) -> tuple[int, int]:
    return tuple(getattr(experts, "quant_block", (1, 0)))  # type: ignore[return-value]


def dequantized(experts: nn.Module, name: str, idx: torch.Tensor | None, dtype: torch.dtype):
    """``experts.<name>`` (``gate_up_proj`` / ``down_proj``) dequantised to ``dtype``, only the
    experts ``idx`` (all when ``None``)."""
    q = getattr(experts, name).detach()
    s = getattr(experts, f"{name}_scale")
    if idx is not None:
        q, s = q.index_select(0, idx), s.index_select(0, idx)
    return dequantize(q, s, block_of(experts), dtype)


def set_quantized(
    experts: nn.Module,
    name: str,
    q: torch.Tensor,
    s: torch.Tensor,
    block: tuple[int, int],
) -> None:
    """Put ``(q, s)`` on the experts module in place of its ``name`` parameter."""
    experts._parameters[name] = nn.Parameter(q, requires_grad=False)
    if f"{name}_scale" in experts._buffers:
        experts._buffers[f"{name}_scale"] = s
    else:
        experts.register_buffer(f"{name}_scale", s, persistent=True)
    experts.quant_block = tuple(block)


def quantize_experts(experts: nn.Module, fmt: Format | str) -> None:
    """Quantise an experts module's two weights in place, expert by expert: the wide tensor of
    one weight is freed as soon as its 8-bit copy is made (peak: one wide weight + its 8-bit
    copy, never all experts twice)."""
    fmt = FORMATS[fmt] if isinstance(fmt, str) else fmt
    with torch.no_grad():
        for name in EXPERT_PARAMS:
            w = getattr(experts, name)
            q, s = quantize(w.detach(), fmt)
            set_quantized(experts, name, q, s, fmt.block)
            del w


def dequantize_experts(experts: nn.Module, dtype: torch.dtype) -> None:
    """Undo :func:`quantize_experts` in place (export: a plain transformers model cannot compute
    on 8-bit experts): ``q * s`` in ``dtype``, the scale buffers dropped; a no-op unless
    quantised."""
    if not is_quantized(experts):
        return
    with torch.no_grad():
        for name in EXPERT_PARAMS:
            w = dequantized(experts, name, None, dtype)
            experts._parameters[name] = nn.Parameter(w, requires_grad=False)
            experts._buffers.pop(f"{name}_scale", None)
    for attr in ("quant_block", "quant_source"):
        experts.__dict__.pop(attr, None)


def layout_of(blocks: list[nn.Module]) -> str | None:
    """``status.host.layout``: the 8-bit format of the MoE blocks' experts and its source."""
    if not blocks or not is_quantized(blocks[0].experts):
        return None
    ex = blocks[0].experts
    dtype = str(ex.gate_up_proj.dtype).removeprefix("torch.")
    br, bc = block_of(ex)
    shape = "per output channel" if (br <= 1 and bc <= 0) else f"{br}x{bc} blocks"
    source = getattr(ex, "quant_source", None) or "quantised at load"
    return f"{dtype} {shape}, {source}"


def expert_nbytes(experts: nn.Module) -> int:
    """Bytes of one expert as the host holds it (8-bit: the bytes plus its scales)."""
    gu, dn = experts.gate_up_proj, experts.down_proj
    n = (gu[0].numel() + dn[0].numel()) * gu.element_size()
    if is_quantized(experts):
        n += (experts.gate_up_proj_scale[0].numel() + experts.down_proj_scale[0].numel()) * 4
    return n


__all__ = [
    "E4M3_MAX",
    "FORMATS",
    "FP8",
    "INT8",
    "Q8_DTYPES",
    "dequantize",
    "dequantized",
    "expert_nbytes",
    "is_q8_name",
    "is_quantized",
    "quantize",
    "quantize_experts",
    "set_quantized",
]
