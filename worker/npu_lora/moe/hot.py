"""Hot experts: routing counts, hot-set selection, and the hybrid hot/cold MoE forward.

Legend (shape suffixes)::

    T  tokens (B*S)          D  hidden size          E  experts of a layer     K  top-k
    P  (token, expert) pairs = T*K, pair p = t*K + k  Pc cold pairs   Ph hot pairs
    Eh hot experts of the layer (slots 0..Eh-1)       Bk tokens per hot expert (padded bucket)
    F  2*I                   I  expert intermediate size

Selection rule (``select_hot``): per layer, ``Eh = ceil(fraction * E)`` (at least 1, at most E)
experts with the highest routing counts; ties go to the lower expert index. Slots are the chosen
expert ids in ascending order.

Hybrid forward of one MoE block (``hot_cold_forward``), all on the host except one device call:

1. router on the host (the stock module: linear, softmax in fp32, top-k, renormalise);
2. pairs ``(t, k)`` whose expert is cold → the model's experts kernel (``experts_implementation``,
   default transformers' ``grouped_mm``) on those pairs, one pair per row (top-k = 1);
3. pairs whose expert is hot → grouped by slot, each group padded to one bucket size Bk (the
   smallest bucket ≥ the largest group) → dense ``x_EhBD`` and ``r_EhB`` (0 on padding) →
   ONE ``HotExpertsBatched`` device call → back to the host, unpadded;
4. per-pair outputs back in pair order, then ``view(T, K, D).sum(1)``: the same per-pair
   products and the same top-k summation order as the stock ``grouped_mm`` kernel.

Exactness: per pair the arithmetic is the stock one (linear, silu·up, linear, × weight); only the
GEMM reduction order of the hot bmm vs grouped_mm may differ (fp32: ≲1e-6 relative; see tests).
All of it is differentiable: gradients reach the block input through the gathers, the device
call, and the routing weights (router softmax).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from npu_lora.backends.base import Backend
from npu_lora.device.graphs import HotExpertsBatched, next_pow2


def default_buckets(tokens: int, top_k: int = 1, *, smallest: int = 8) -> tuple[int, ...]:
    """Powers of two from ``smallest`` up to the first ≥ min(tokens, tokens*top_k).

    A hot expert receives at most ``tokens`` pairs (a token picks an expert at most once), so
    buckets beyond ``tokens`` are never needed."""
    cap = next_pow2(max(1, min(tokens, tokens * top_k)))
    out, b = [], min(smallest, cap)
    while b < cap:
        out.append(b)
        b *= 2
    out.append(cap)
    return tuple(out)


def pick_bucket(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if b >= n:
            return b
    big = next_pow2(n)
    warnings.warn(
        f"hot-expert group of {n} tokens exceeds the largest bucket {buckets[-1]}; using {big}",
        stacklevel=2,
    )
    return big


def hot_count(fraction: float, num_experts: int) -> int:
    """``ceil(fraction * E)`` clamped to [1, E] (with a 1e-9 guard against float noise)."""
    return min(num_experts, max(1, math.ceil(fraction * num_experts - 1e-9)))


def select_hot(counts_LE: torch.Tensor, fraction: float) -> list[list[int]]:
    """Per layer, the ``hot_count`` most-routed experts (ties: lower index), ascending."""
    L, E = counts_LE.shape
    k = hot_count(fraction, E)
    out = []
    for layer in range(L):
        order = torch.argsort(-counts_LE[layer].to(torch.int64), stable=True)  # ties: lower index
        out.append(sorted(int(e) for e in order[:k]))
    return out


@dataclass
class HotLayer:
    """The hot experts of one layer: host bookkeeping + the device module."""

    experts: list[int]
    slot_of_expert_E: torch.Tensor  # int64 [E], -1 for cold experts
    module: HotExpertsBatched  # on the device
    fn: Callable[..., torch.Tensor]  # the (possibly compiled) module
    buckets: tuple[int, ...]
    device_dtype: torch.dtype
    bucket_hist: dict[int, int] = field(default_factory=dict)

    @property
    def num_hot(self) -> int:
        return len(self.experts)


def make_hot_layer(
    experts_module: nn.Module,
    expert_ids: list[int],
    backend: Backend,
    *,
    buckets: tuple[int, ...],
    device_dtype: torch.dtype,
) -> HotLayer:
    """Copy the chosen experts' weights to the device as stacked ``[Eh, 2I, D]`` / ``[Eh, D, I]``."""
    E = experts_module.gate_up_proj.shape[0]
    ids = torch.tensor(expert_ids, dtype=torch.int64)
    slot = torch.full((E,), -1, dtype=torch.int64)
    slot[ids] = torch.arange(len(expert_ids))
    with torch.no_grad():
        w_gu = experts_module.gate_up_proj.detach()[ids].to(device_dtype)
        w_dn = experts_module.down_proj.detach()[ids].to(device_dtype)
        module = HotExpertsBatched(backend.to_device(w_gu), backend.to_device(w_dn)).to(
            backend.device
        )
    return HotLayer(
        list(expert_ids), slot, module, backend.compile(module), tuple(buckets), device_dtype
    )


def refresh_hot_layer(layer: HotLayer, experts_module: nn.Module, backend: Backend) -> None:
    """Re-copy the hot experts' weights (after the host weights changed)."""
    ids = torch.tensor(layer.experts, dtype=torch.int64)
    with torch.no_grad():
        layer.module.load(
            backend.to_device(experts_module.gate_up_proj.detach()[ids].to(layer.device_dtype)),
            backend.to_device(experts_module.down_proj.detach()[ids].to(layer.device_dtype)),
        )


@dataclass
class HotPlan:
    """Routing and dispatch of one block call (indices only; no graph through ``x``).

    ``P = T*K`` (token, expert) pairs; ``cold_Pc``/``hot_Ph`` index them; hot pairs are grouped
    by hot slot and padded to one bucket ``Bk``: ``src_EhB`` is the pair feeding each padded row
    (``P`` = the zero padding row), ``dest_Ph`` each hot pair's padded row.
    """

    T: int
    K: int
    r_P: torch.Tensor
    e_P: torch.Tensor
    tok_P: torch.Tensor
    cold_Pc: torch.Tensor
    hot_Ph: torch.Tensor
    dest_Ph: torch.Tensor
    src_EhB: torch.Tensor
    Eh: int
    Bk: int


def plan_hot_cold(x_TD: torch.Tensor, gate: nn.Module, hot: HotLayer) -> HotPlan:
    """Route on the host (stock router: fp32 softmax, top-k, renormalise) and plan the dispatch."""
    T, _ = x_TD.shape
    _, r_TK, idx_TK = gate(x_TD)
    K = idx_TK.shape[1]
    P = T * K
    e_P = idx_TK.reshape(-1)
    r_P = r_TK.reshape(-1)
    tok_P = torch.arange(P) // K
    slot_P = hot.slot_of_expert_E[e_P]
    is_hot_P = slot_P >= 0
    cold_Pc = (~is_hot_P).nonzero().squeeze(1)
    hot_Ph = is_hot_P.nonzero().squeeze(1)
    Eh = hot.num_hot
    slot_Ph = slot_P[hot_Ph]
    order = torch.argsort(slot_Ph, stable=True)
    hot_Ph, slot_Ph = hot_Ph[order], slot_Ph[order]
    counts_Eh = torch.bincount(slot_Ph, minlength=Eh)
    Bk = pick_bucket(int(counts_Eh.max()) if hot_Ph.numel() else 1, hot.buckets)
    hot.bucket_hist[Bk] = hot.bucket_hist.get(Bk, 0) + 1
    start_Eh = torch.cumsum(counts_Eh, 0) - counts_Eh
    dest_Ph = slot_Ph * Bk + (torch.arange(hot_Ph.numel()) - start_Eh[slot_Ph])
    src_EhB = torch.full((Eh * Bk,), P, dtype=torch.int64)  # P = the padding row
    src_EhB[dest_Ph] = hot_Ph
    return HotPlan(T, K, r_P, e_P, tok_P, cold_Pc, hot_Ph, dest_Ph, src_EhB, Eh, Bk)


def hot_inputs(
    x_TD: torch.Tensor, r_P: torch.Tensor, plan: HotPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense padded hot inputs ``x_EhBD``, ``r_EhB`` (routing weight 0 on padding rows)."""
    T, D = x_TD.shape
    tok_ext = torch.cat([plan.tok_P, torch.tensor([T])])
    x_ext_TD = torch.cat([x_TD, x_TD.new_zeros(1, D)])
    r_ext_P = torch.cat([r_P, r_P.new_zeros(1)])
    x_EhBD = x_ext_TD[tok_ext[plan.src_EhB]].view(plan.Eh, plan.Bk, D)
    r_EhB = r_ext_P[plan.src_EhB].view(plan.Eh, plan.Bk)
    return x_EhBD, r_EhB


def cold_inputs(x_TD: torch.Tensor, plan: HotPlan):
    """The cold pairs' rows for the model's experts kernel (one (token, expert) pair a row)."""
    c = plan.cold_Pc
    return x_TD[plan.tok_P[c]], plan.e_P[c, None], plan.r_P[c, None]


def combine(
    y_cold: torch.Tensor, y_EhBD: torch.Tensor, x_TD: torch.Tensor, plan: HotPlan, backend: Backend
) -> torch.Tensor:
    """Unpad the hot result, put per-pair outputs back in pair order, then the stock top-k sum."""
    D = x_TD.shape[1]
    y_hot = backend.to_host(y_EhBD).to(x_TD.dtype).reshape(plan.Eh * plan.Bk, D)[plan.dest_Ph]
    perm_P = torch.cat([plan.cold_Pc, plan.hot_Ph])
    inv_P = torch.empty_like(perm_P)
    inv_P[perm_P] = torch.arange(plan.T * plan.K)
    y_PD = torch.cat([y_cold.to(x_TD.dtype), y_hot])[inv_P]
    return y_PD.view(plan.T, plan.K, D).sum(dim=1)


def hot_cold_forward(
    x_TD: torch.Tensor,
    gate: nn.Module,
    experts: nn.Module,
    hot: HotLayer,
    backend: Backend,
    layer: int,
    *,
    on_device_s: Callable[[float], None] | None = None,
) -> torch.Tensor:
    """The MoE block output ``y_TD`` with hot experts on the device (see module doc).

    Sequential: cold experts on the host, then the one hot-expert device call. The overlapped
    variant (``npu_lora.moe.overlap``) issues the device call first; same arithmetic.
    """
    plan = plan_hot_cold(x_TD, gate, hot)
    if plan.cold_Pc.numel():
        y_cold = experts(*cold_inputs(x_TD, plan))
    else:
        y_cold = x_TD.new_zeros(0, x_TD.shape[1])

    x_EhBD, r_EhB = hot_inputs(x_TD, plan.r_P, plan)
    t0 = time.perf_counter()
    y_EhBD = backend.call(
        "hot_experts",
        hot.fn,
        backend.to_device(x_EhBD.to(hot.device_dtype)),
        backend.to_device(r_EhB.to(hot.device_dtype)),
        layer=layer,
    )
    y_TD = combine(y_cold, y_EhBD, x_TD, plan, backend)
    if on_device_s is not None:
        on_device_s(time.perf_counter() - t0)
    return y_TD
