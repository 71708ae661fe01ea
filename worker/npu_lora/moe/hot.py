"""Hot experts: routing counts, hot-set selection, and the hybrid hot/cold MoE forward.

Legend (shape suffixes)::

    T  tokens (B*S)          D  hidden size          E  experts of a layer     K  top-k
    P  (token, expert) pairs = T*K, pair p = t*K + k  Pc cold pairs   Ph hot pairs
    Eh hot experts of the layer (slots 0..Eh-1)       Bk tokens per hot expert (padded bucket)
    F  2*I                   I  expert intermediate size

Selection rule (``select_hot``): per layer, ``Eh = hot_count(fraction, E)`` (``api.sizing``: ``ceil(fraction * E)``,
at least 1, at most E) experts with the highest routing counts; ties go to the lower expert index. Slots are the chosen
expert ids in ascending order.

Hybrid forward of one MoE block (``hot_cold_forward``), all on the host except one device call:

1. router on the host (the stock module: linear, softmax in fp32, top-k, renormalise);
2. pairs ``(t, k)`` whose expert is cold → the model's experts kernel (``experts_implementation``,
   default transformers' ``grouped_mm``) on those pairs, one pair per row (top-k = 1);
3. pairs whose expert is hot → grouped by slot, each group padded to one bucket size Bk
   (``choose_bucket``) → dense ``x_EhBD`` and ``r_EhB`` (0 on padding) → ONE
   ``HotExpertsBatched`` device call → back to the host, unpadded. A slot's pairs beyond Bk
   (*overflow*, in pair order) are computed on the host with the cold pairs, by the same expert
   weights and kernel;
4. per-pair outputs back in pair order, then ``view(T, K, D).sum(1)``: the same per-pair
   products and the same top-k summation order as the stock ``grouped_mm`` kernel.

   When the padded rows outnumber the tokens (``Eh·Bk > T``) and the backend allows it
   (``HotLayer.device_gather``: cpu, cuda), step 3 sends the T token rows once with an int32
   row index instead, and ``HotExpertsGathered`` gathers, computes and sums the hot pairs per
   token on the device; T rows come back (``combine_tokens``: cold per-token sum + hot, the same
   per-pair products in another summation order). Every copy is counted at the backend seam.

Bucket choice (``choose_bucket``, ``capacity="cost"``, the default). Padding every slot to the
largest group wastes most of the dense tensor when routing is skewed, and hot experts are skewed
by construction: measured on an H200 + 16-core host (Qwen3-30B-A3B widths, S=512, hot 0.25),
padding to the largest group sent 32×512 rows for ~1,600 real pairs, and hot placement was
2.1× *slower* than host-only (experiments/2026-11-30-cuda-backend-h200.md). The cost model
picks the Bk, among the buckets, that minimises the bytes moved per call::

    cost(Bk) = Eh·Bk·row_bytes                       # padded rows to the device and back
             + #{slots with count > Bk}·expert_bytes  # overflowing experts read on the host

``row_bytes = 2·D·sizeof(transfer dtype)``, ``expert_bytes`` = one expert's host weights
(gate_up + down). Ties go to the larger bucket (less host work). ``capacity="max"`` is the old
rule (the smallest bucket ≥ the largest group; never overflows).

Exactness: per pair the arithmetic is the stock one (linear, silu·up, linear, × weight); only the
GEMM reduction order of the hot bmm vs grouped_mm may differ (fp32: ≲1e-6 relative; see tests).
All of it is differentiable: gradients reach the block input through the gathers, the device
call, and the routing weights (router softmax).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from npu_lora.api.sizing import hot_count, next_pow2
from npu_lora.backends.base import Backend
from npu_lora.device.graphs import HotExpertsBatched, HotExpertsGathered
from npu_lora.moe.experts import expert_bytes


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


def choose_bucket(
    counts_Eh: torch.Tensor,
    buckets: tuple[int, ...],
    *,
    capacity: str = "cost",
    row_bytes: int = 1,
    expert_bytes: int = 0,
) -> int:
    """The padded rows per hot slot (``Bk``) for this call's per-slot pair counts.

    ``capacity="max"``: the smallest bucket ≥ the largest count (no overflow).
    ``capacity="cost"``: among the buckets up to that one, the one minimising
    ``Eh·Bk·row_bytes + #{count > Bk}·expert_bytes`` (ties: the larger bucket)."""
    n_max = int(counts_Eh.max()) if counts_Eh.numel() else 0
    fit = pick_bucket(max(n_max, 1), buckets)
    if capacity == "max" or expert_bytes <= 0:
        return fit
    if capacity != "cost":
        raise ValueError(f"capacity must be 'cost' or 'max', not {capacity!r}")
    Eh = counts_Eh.numel()
    best, best_cost = fit, Eh * fit * row_bytes
    for b in sorted((b for b in buckets if b < fit), reverse=True):
        cost = Eh * b * row_bytes + int((counts_Eh > b).sum()) * expert_bytes
        if cost < best_cost:
            best, best_cost = b, cost
    return best


def select_hot(counts_LE: torch.Tensor, fraction: float) -> list[list[int]]:
    """Per layer, the ``hot_count`` most-routed experts (ties: lower index), ascending."""
    L, E = counts_LE.shape
    k = hot_count(fraction, E)
    out = []
    for layer in range(L):
        order = torch.argsort(-counts_LE[layer].to(torch.int64), stable=True)  # ties: lower index
        out.append(sorted(int(e) for e in order[:k]))
    return out


def select_hot_memory(
    counts_LE: torch.Tensor, budget_bytes: int, expert_bytes_device: int
) -> list[list[int]]:
    """``moe.hotMemory``: the hot set across all layers that routes the most tokens to the
    device within ``budget_bytes``; per layer ascending expert ids (a layer may get none).

    A 0/1 knapsack whose items (layer, expert) all weigh the same (every expert of a model has
    the same shapes, so the same device bytes): any feasible set has at most
    ``N = budget // expert_bytes`` items, and the value of N items is largest for the N largest
    counts (exchange argument: swapping a chosen item for an unchosen larger one never lowers
    the total). So the greedy choice by count — by count per byte, the bytes being equal — is
    optimal. Ties: lower layer, then lower expert index."""
    L, E = counts_LE.shape
    n = min(L * E, max(0, int(budget_bytes) // max(int(expert_bytes_device), 1)))
    flat = counts_LE.reshape(-1).to(torch.float64)
    order = torch.argsort(-flat, stable=True)[:n]  # stable: ties go to the lower (layer, expert)
    out: list[list[int]] = [[] for _ in range(L)]
    for i in order.tolist():
        out[i // E].append(i % E)
    return [sorted(x) for x in out]


def coverage(counts_LE: torch.Tensor, per_layer: list[list[int]]) -> float:
    """Fraction of the routed (token, expert) pairs in ``counts_LE`` that go to the hot set."""
    total = float(counts_LE.sum())
    if total <= 0:
        return 0.0
    hit = sum(float(counts_LE[i, ids].sum()) for i, ids in enumerate(per_layer) if ids)
    return hit / total


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
    capacity: str = "cost"  # "cost" (padded rows vs host overflow) or "max" (pad to the largest)
    row_bytes: int = 0  # one padded row to the device and back (2·D·sizeof(device dtype))
    expert_bytes: int = 0  # one expert's host weights (gate_up + down)
    pairs_device: int = 0  # statistics, per plan (recomputes too): real pairs sent to the device,
    pairs_overflow: int = 0  # hot pairs computed on the host (overflow),
    rows_padded: int = 0  # padded rows sent (Eh·Bk per call)
    overflow_E: torch.Tensor | None = None  # bool [E]: hot experts that overflowed (ever)
    layer: int | None = None  # decoder layer (traffic accounting, staging buffer names)
    #: gather the hot rows on the device from the T token rows when Eh·Bk > T (fewer rows
    #: sent and returned); the engine turns it on for cpu/cuda, not (yet) for furiosa
    device_gather: bool = False
    gathered_fn: Callable[..., torch.Tensor] | None = None

    @property
    def num_hot(self) -> int:
        return len(self.experts)


def _device_weights(
    experts_module: nn.Module,
    ids: list[int],
    backend: Backend,
    dtype: torch.dtype,
    layer: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts ``ids``' weights on the device as ``[n, 2I, D]``, ``[n, D, I]`` in ``dtype``
    (counted host→device traffic of ``layer``)."""
    idx = torch.tensor(ids, dtype=torch.int64)
    from npu_lora.models import quant

    if quant.is_quantized(experts_module):  # 8-bit host experts: the bytes and scales move,
        out = []  # dequantised to ``dtype`` on the device (traffic counted as 8-bit reads)
        with torch.no_grad():
            for name in quant.EXPERT_PARAMS:
                q = getattr(experts_module, name).detach().index_select(0, idx)
                s = getattr(experts_module, f"{name}_scale").index_select(0, idx)
                q_d = backend.to_device(q, layer=layer)
                s_d = backend.to_device(s, layer=layer)
                out.append(quant.dequantize(q_d, s_d, quant.block_of(experts_module), dtype))
        return out[0], out[1]
    with torch.no_grad():
        w_gu = backend.to_device(
            experts_module.gate_up_proj.detach().index_select(0, idx), layer=layer, dtype=dtype
        )
        w_dn = backend.to_device(
            experts_module.down_proj.detach().index_select(0, idx), layer=layer, dtype=dtype
        )
    return w_gu, w_dn


def device_expert_bytes(experts_module: nn.Module, dtype: torch.dtype) -> int:
    """One expert's weights in the device dtype (what a move sends): ``expert_bytes`` rescaled."""
    w = experts_module.gate_up_proj
    from npu_lora.models import quant

    if quant.is_quantized(experts_module):  # the 8-bit bytes and the scales move
        return quant.expert_nbytes(experts_module)
    return expert_bytes(w, experts_module.down_proj) // w.element_size() * dtype.itemsize


def make_hot_layer(
    experts_module: nn.Module,
    expert_ids: list[int],
    backend: Backend,
    *,
    buckets: tuple[int, ...],
    device_dtype: torch.dtype,
    capacity: str = "cost",
    layer: int | None = None,
    device_gather: bool = False,
) -> HotLayer:
    """Copy the chosen experts' weights to the device as stacked ``[Eh, 2I, D]`` / ``[Eh, D, I]``.
    ``capacity``: the bucket rule (``choose_bucket``); ``layer``: for the traffic accounting;
    ``device_gather``: see ``HotLayer.device_gather``."""
    E = experts_module.gate_up_proj.shape[0]
    ids = torch.tensor(expert_ids, dtype=torch.int64)
    slot = torch.full((E,), -1, dtype=torch.int64)
    slot[ids] = torch.arange(len(expert_ids))
    w_gu, w_dn = _device_weights(experts_module, list(expert_ids), backend, device_dtype, layer)
    module = HotExpertsBatched(w_gu, w_dn).to(backend.device)
    D = experts_module.gate_up_proj.shape[-1]
    return _with_gather(
        HotLayer(
            list(expert_ids),
            slot,
            module,
            backend.compile(module),
            tuple(buckets),
            device_dtype,
            capacity=capacity,
            row_bytes=2 * D * device_dtype.itemsize,
            expert_bytes=expert_bytes(experts_module.gate_up_proj, experts_module.down_proj),
            overflow_E=torch.zeros(E, dtype=torch.bool),
            layer=layer,
        ),
        backend,
        device_gather,
    )


def _with_gather(hot: HotLayer, backend: Backend, device_gather: bool) -> HotLayer:
    hot.device_gather = device_gather
    hot.gathered_fn = backend.compile(HotExpertsGathered(hot.module)) if device_gather else None
    return hot


def refresh_hot_layer(layer: HotLayer, experts_module: nn.Module, backend: Backend) -> None:
    """Re-copy the hot experts' weights (after the host weights changed)."""
    w_gu, w_dn = _device_weights(
        experts_module, layer.experts, backend, layer.device_dtype, layer.layer
    )
    layer.module.load(w_gu, w_dn)


def move_hot_layer(
    hot: HotLayer, experts_module: nn.Module, new_ids: list[int], backend: Backend
) -> tuple[HotLayer, int]:
    """Change a layer's hot set to ``new_ids``, copying only the experts that enter.

    Same size: each entering expert takes the slot of a leaving one (the device keeps the
    others' weights in place). Another size (``moe.hotMemory`` moves budget between layers): the
    kept experts' weights are gathered on the device, the entering ones copied, and the module
    rebuilt (a new static shape: the device graph recompiles for it). Returns the layer and
    the number of experts copied."""
    old = list(hot.experts)
    keep = [e for e in old if e in set(new_ids)]
    enter = [e for e in new_ids if e not in set(old)]
    leave = [e for e in old if e not in set(new_ids)]
    if not enter and not leave:
        return hot, 0
    E = hot.slot_of_expert_E.numel()
    if len(new_ids) == len(old):
        slots = [int(hot.slot_of_expert_E[e]) for e in leave]
        experts = list(old)
        if enter:
            w_gu, w_dn = _device_weights(
                experts_module, enter, backend, hot.device_dtype, hot.layer
            )
            with torch.no_grad():
                for j, (s, e) in enumerate(zip(slots, enter, strict=True)):
                    hot.module.w_gate_up_EhFD[s].copy_(w_gu[j])
                    hot.module.w_down_EhDI[s].copy_(w_dn[j])
                    experts[s] = e
        hot.experts = experts
        slot = torch.full((E,), -1, dtype=torch.int64)
        slot[torch.tensor(experts, dtype=torch.int64)] = torch.arange(len(experts))
        hot.slot_of_expert_E = slot
        return hot, len(enter)
    keep_slots = torch.tensor(
        [int(hot.slot_of_expert_E[e]) for e in keep], dtype=torch.int64, device=backend.device
    )
    with torch.no_grad():
        gu = [hot.module.w_gate_up_EhFD.index_select(0, keep_slots)]
        dn = [hot.module.w_down_EhDI.index_select(0, keep_slots)]
        if enter:
            w_gu, w_dn = _device_weights(
                experts_module, enter, backend, hot.device_dtype, hot.layer
            )
            gu.append(w_gu)
            dn.append(w_dn)
        module = HotExpertsBatched(torch.cat(gu), torch.cat(dn)).to(backend.device)
    experts = keep + enter
    slot = torch.full((E,), -1, dtype=torch.int64)
    slot[torch.tensor(experts, dtype=torch.int64)] = torch.arange(len(experts))
    new = HotLayer(
        experts,
        slot,
        module,
        backend.compile(module),
        hot.buckets,
        hot.device_dtype,
        capacity=hot.capacity,
        row_bytes=hot.row_bytes,
        expert_bytes=hot.expert_bytes,
        overflow_E=torch.zeros(E, dtype=torch.bool),
        layer=hot.layer,
    )
    return _with_gather(new, backend, hot.device_gather), len(enter)


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
    layer: int | None = None


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
    Bk = choose_bucket(
        counts_Eh,
        hot.buckets,
        capacity=hot.capacity,
        row_bytes=hot.row_bytes,
        expert_bytes=hot.expert_bytes,
    )
    start_Eh = torch.cumsum(counts_Eh, 0) - counts_Eh
    rank_Ph = torch.arange(hot_Ph.numel()) - start_Eh[slot_Ph]  # position within its slot
    over = rank_Ph >= Bk  # overflow: computed on the host with the cold pairs
    if bool(over.any()):
        if hot.overflow_E is not None:
            hot.overflow_E[e_P[hot_Ph[over]]] = True
        cold_Pc = torch.cat([cold_Pc, hot_Ph[over]]).sort().values
        keep = ~over
        hot_Ph, slot_Ph, rank_Ph = hot_Ph[keep], slot_Ph[keep], rank_Ph[keep]
        hot.pairs_overflow += int(over.sum())
    hot.bucket_hist[Bk] = hot.bucket_hist.get(Bk, 0) + 1
    hot.pairs_device += hot_Ph.numel()
    hot.rows_padded += Eh * Bk
    dest_Ph = slot_Ph * Bk + rank_Ph
    src_EhB = torch.full((Eh * Bk,), P, dtype=torch.int64)  # P = the padding row
    src_EhB[dest_Ph] = hot_Ph
    return HotPlan(T, K, r_P, e_P, tok_P, cold_Pc, hot_Ph, dest_Ph, src_EhB, Eh, Bk, hot.layer)


# Gathers use ``index_select`` (backward: ``index_add_``) rather than ``a[idx]`` (backward:
# ``index_put_(accumulate=True)``): same forward values; the backward of a [4096, 2048] gather
# from 512 rows took 19.7 vs 88.8 ms (bf16) and 21.1 vs 40.0 ms (fp32, bitwise-equal grads),
# one thread, this 2-core VM (experiments/2026-11-30-cuda-backend-h200.md).


def hot_inputs(
    x_TD: torch.Tensor, r_P: torch.Tensor, plan: HotPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense padded hot inputs ``x_EhBD``, ``r_EhB`` (routing weight 0 on padding rows).

    One gather pass straight from ``x_TD``: a padding row repeats token 0's row (its routing
    weight is 0, so its output and its gradient contribution are exactly 0), so no zero row is
    appended to a copy of ``x_TD`` first."""
    D = x_TD.shape[1]
    tok_EhB, r_EhB = hot_rows(r_P, plan)
    x_EhBD = x_TD.index_select(0, tok_EhB.reshape(-1)).view(plan.Eh, plan.Bk, D)
    return x_EhBD, r_EhB


def hot_rows(r_P: torch.Tensor, plan: HotPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """The token feeding each padded hot row, ``tok_EhB`` (padding: token 0), and the rows'
    routing weights ``r_EhB`` (0 on padding)."""
    pad = plan.src_EhB == plan.T * plan.K
    tok = plan.tok_P.index_select(0, plan.src_EhB.clamp(max=plan.T * plan.K - 1))
    r_ext_P = torch.cat([r_P, r_P.new_zeros(1)])
    r_EhB = r_ext_P.index_select(0, plan.src_EhB).view(plan.Eh, plan.Bk)
    return tok.masked_fill(pad, 0).view(plan.Eh, plan.Bk), r_EhB


def gathers_on_device(hot: HotLayer, plan: HotPlan) -> bool:
    """Send the T token rows and gather on the device (``HotExpertsGathered``) when that sends
    fewer rows than the Eh·Bk padded ones."""
    return hot.device_gather and plan.Eh * plan.Bk > plan.T


def cold_inputs(x_TD: torch.Tensor, plan: HotPlan):
    """The cold pairs' rows for the model's experts kernel (one (token, expert) pair a row)."""
    c = plan.cold_Pc
    return (
        x_TD.index_select(0, plan.tok_P[c]),
        plan.e_P[c, None],
        plan.r_P.index_select(0, c)[:, None],
    )


def combine(
    y_cold: torch.Tensor, y_EhBD: torch.Tensor, x_TD: torch.Tensor, plan: HotPlan, backend: Backend
) -> torch.Tensor:
    """Unpad the hot result, put per-pair outputs back in pair order, then the stock top-k sum."""
    D = x_TD.shape[1]
    y_hot = (
        backend.to_host(y_EhBD, layer=plan.layer)
        .to(x_TD.dtype)
        .reshape(plan.Eh * plan.Bk, D)
        .index_select(0, plan.dest_Ph)
    )
    perm_P = torch.cat([plan.cold_Pc, plan.hot_Ph])
    inv_P = torch.empty_like(perm_P)
    inv_P[perm_P] = torch.arange(plan.T * plan.K)
    y_PD = torch.cat([y_cold.to(x_TD.dtype), y_hot]).index_select(0, inv_P)
    return y_PD.view(plan.T, plan.K, D).sum(dim=1)


def combine_tokens(
    y_cold: torch.Tensor,
    y_hot_TD: torch.Tensor,
    x_TD: torch.Tensor,
    plan: HotPlan,
    backend: Backend,
) -> torch.Tensor:
    """The device-combined path (``HotExpertsGathered``): the hot pairs arrive summed per token
    (``[T, D]``, T rows instead of Eh·Bk); the cold pairs are summed per token on the host and
    the two added. Same per-pair products; the top-k sum runs in another order than the stock
    ``view(T, K, D).sum(1)`` (cold pairs, then hot), so it agrees to rounding, not bitwise."""
    T, D = x_TD.shape
    y_hot = backend.to_host(y_hot_TD, layer=plan.layer).to(x_TD.dtype)
    if plan.cold_Pc.numel() == 0:
        return y_hot
    y_cold_TD = x_TD.new_zeros(T, D).index_add(
        0, plan.tok_P.index_select(0, plan.cold_Pc), y_cold.to(x_TD.dtype)
    )
    return y_cold_TD + y_hot


def send_hot_inputs(
    x_EhBD: torch.Tensor, r_EhB: torch.Tensor, hot: HotLayer, backend: Backend, layer: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hot inputs to the device in the device dtype: cast while writing the layer's reused
    (pinned on cuda) staging buffers, then one copy each (counted as layer ``layer``)."""
    return (
        backend.to_device(x_EhBD, layer=layer, dtype=hot.device_dtype, stage=f"hot{layer}.x"),
        backend.to_device(r_EhB, layer=layer, dtype=hot.device_dtype, stage=f"hot{layer}.r"),
    )


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

    if gathers_on_device(hot, plan):
        t0 = time.perf_counter()
        tok_EhB, r_EhB = hot_rows(plan.r_P, plan)
        args = (
            backend.to_device(x_TD, layer=layer, dtype=hot.device_dtype, stage=f"hot{layer}.xT"),
            backend.to_device(tok_EhB.to(torch.int32), layer=layer, stage=f"hot{layer}.i"),
            backend.to_device(r_EhB, layer=layer, dtype=hot.device_dtype, stage=f"hot{layer}.r"),
        )
        assert hot.gathered_fn is not None
        y_hot_TD = backend.call("hot_experts", hot.gathered_fn, *args, layer=layer)
        y_TD = combine_tokens(y_cold, y_hot_TD, x_TD, plan, backend)
    else:
        x_EhBD, r_EhB = hot_inputs(x_TD, plan.r_P, plan)
        t0 = time.perf_counter()
        x_dev, r_dev = send_hot_inputs(x_EhBD, r_EhB, hot, backend, layer)
        y_EhBD = backend.call("hot_experts", hot.fn, x_dev, r_dev, layer=layer)
        y_TD = combine(y_cold, y_EhBD, x_TD, plan, backend)
    if on_device_s is not None:
        on_device_s(time.perf_counter() - t0)
    return y_TD
