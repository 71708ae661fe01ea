"""What the streaming experts kernels share (:mod:`npu_lora.moe.stream` on bf16/fp32 weights,
:mod:`npu_lora.moe.stream_q8` on 8-bit ones): the task blocking, the arguments as the extension
takes them, and the torch fallback used without the extension (one hit expert at a time; the
weights indexed per expert, ``gu[e]`` / ``dn[e]``, so 8-bit experts are dequantised one by one).

Legend: S routed (token, expert) slots sorted by expert, H hidden, I expert intermediate;
``x_g [S, H]`` gathered inputs, ``w_g [S]`` routing weights, ``h [S, 2I]`` gate/up
pre-activations kept for backward, ``gu [E, 2I, H]``, ``dn [E, H, I]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from npu_lora.moe.routing import Routing

#: Row blocks per task (shape-only, so the task list never depends on the thread count).
GU_BLOCK = 64  # forward: gate rows (and the matching up rows) per task
DOWN_BLOCK = 256  # forward: down_proj rows per task
BWD_SPLITS = 2  # backward: each expert's rows in this many blocks (partial sums, fixed order)


def _offsets(r: Routing) -> torch.Tensor:
    counts = torch.tensor([0, *r.counts], dtype=torch.int64)
    return torch.cumsum(counts, 0)


def _torch_forward(x_g, w_g, r: Routing, gu, dn):
    S, inter = x_g.shape[0], dn.shape[2]
    h = x_g.new_zeros(S, 2 * inter)
    y = x_g.new_zeros(S, x_g.shape[1])
    s0 = 0
    for e, n in enumerate(r.counts):
        if n:
            seg = slice(s0, s0 + n)
            h[seg] = x_g[seg] @ gu[e].float().t()
            g, u = h[seg].chunk(2, dim=-1)
            y[seg] = (F.silu(g) * u) @ dn[e].float().t()
            s0 += n
    y.mul_(w_g.unsqueeze(-1))
    if r.valid < S:
        y[r.valid :] = 0
    return y[r.inv_perm].view(r.num_tokens, r.top_k, -1).sum(dim=1), h


def _torch_backward(g_g, h, w_g, r: Routing, gu, dn):
    S, inter = g_g.shape[0], dn.shape[2]
    z = g_g.new_zeros(S, inter)
    s0 = 0
    for e, n in enumerate(r.counts):
        if n:
            z[s0 : s0 + n] = g_g[s0 : s0 + n] @ dn[e].float()
            s0 += n
    gate, up = h.chunk(2, dim=-1)
    sig = torch.sigmoid(gate)
    silu = gate * sig
    dw = (silu * up * z).sum(-1)
    da = z * w_g.unsqueeze(-1)
    dh = torch.cat([da * up * (sig * (1 + gate * (1 - sig))), da * silu], dim=-1)
    dx = g_g.new_zeros(S, g_g.shape[1])
    s0 = 0
    for e, n in enumerate(r.counts):
        if n:
            dx[s0 : s0 + n] = dh[s0 : s0 + n] @ gu[e].float()
            s0 += n
    if r.valid < S:
        dx[r.valid :] = 0
        dw[r.valid :] = 0
    return dx[r.inv_perm].view(r.num_tokens, r.top_k, -1).sum(dim=1), dw, dh


def _activations(t: torch.Tensor) -> torch.Tensor:
    """[T, H] hidden states or gradients as the extension takes them: contiguous fp32 or bf16."""
    t = t.detach()
    if t.dtype not in (torch.float32, torch.bfloat16):
        t = t.float()
    return t.contiguous()
