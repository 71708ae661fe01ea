"""Overlap the hot-expert device call with the cold experts on the host.

``hot_cold_forward`` (``npu_lora.moe.hot``) runs: router → cold experts on the host → ONE
synchronised hot-expert device call → combine. The two expert halves are independent, so the
device call can be *issued first, asynchronously*, and the host computes the cold experts while
the device works; the host waits for the device only when it combines the outputs.

``hot_cold_forward_overlapped`` is a drop-in replacement for ``hot_cold_forward`` (same
signature plus ``runner``), with the same arithmetic in the same order per (token, expert) pair
and the same final top-k sum, so its outputs and gradients are **bitwise equal** to the
sequential function's (tested on the CPU with a thread pool standing in for an asynchronous
device: ``ThreadRunner``).

Runners (``AsyncRunner``): ``submit(fn, *args) -> handle``; ``wait(handle) -> result``.

- ``SyncRunner``: runs at once (``cpu`` backend: the host *is* the device, nothing to overlap;
  this keeps it sequential);
- ``StreamRunner``: ``cuda`` / ``furiosa``: issues the call on a side stream of the device
  (``torch.get_device_module(device).Stream``), records an event; ``wait`` makes the current
  stream wait for that event (no host blocking until the device→host copy of the result, which
  ``backend.to_host`` does on the current stream after the wait);
- ``ThreadRunner``: a one-thread pool (tests; a fake asynchronous device).

Grad mode is thread- and context-local: the submitted call runs under the caller's grad mode, so
the autograd graph through the device call is recorded exactly as in the sequential function
(keep_graph forward and recompute: grad enabled; ``keep_graph=False`` forward: no_grad).

Device-call counting: the overlapped call is counted like ``Backend.call`` counts it (one
``hot_experts`` call with ``layer=<i>``; ``call_s`` gets the time the host *waited* for it, not
the device time), via ``count_call``; it does not synchronise the device inside the call.

Engine hook (for the engine, not wired in by this module): in ``HostMLP.block_forward`` replace
``hot_cold_forward(...)`` by ``hot_cold_forward_overlapped(..., runner=runner_for(backend))``
when ``backend.name != "cpu"`` (``runner_for`` returns ``SyncRunner`` for the cpu backend anyway).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import torch
from torch import nn

from npu_lora.backends.base import Backend
from npu_lora.moe.hot import HotLayer, pick_bucket


class AsyncRunner(Protocol):
    def submit(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    def wait(self, handle: Any) -> Any: ...


class SyncRunner:
    """Runs the call at once (the host stands in for the device: nothing to overlap)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def wait(self, handle: Any) -> Any:
        return handle


class ThreadRunner:
    """A fake asynchronous device: the call runs on a worker thread under the caller's grad mode."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fake-device")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        grad = torch.is_grad_enabled()

        def run() -> Any:
            with torch.set_grad_enabled(grad):
                return fn(*args)

        return self._pool.submit(run)

    def wait(self, handle: Future) -> Any:
        return handle.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class StreamRunner:
    """Asynchronous device call on a side stream (cuda, furiosa: any device module with
    ``Stream``/``stream``/``current_stream``; the result is ready for the current stream after
    ``wait``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.mod = torch.get_device_module(device.type)
        self.stream = self.mod.Stream(device=device)

    def submit(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
        current = self.mod.current_stream(self.device)
        self.stream.wait_stream(current)  # inputs were produced on the current stream
        with self.mod.stream(self.stream):
            out = fn(*args)
            event = self.stream.record_event()
        for a in args:  # keep the inputs' memory alive until the side stream is done with them
            if isinstance(a, torch.Tensor) and a.device.type == self.device.type:
                a.record_stream(self.stream)
        return out, event

    def wait(self, handle: tuple[Any, Any]) -> Any:
        out, event = handle
        current = self.mod.current_stream(self.device)
        current.wait_event(event)
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                t.record_stream(current)  # allocated on the side stream, consumed on this one
        return out


def runner_for(backend: Backend) -> AsyncRunner:
    """``SyncRunner`` for the cpu backend (sequential by design), else a ``StreamRunner``."""
    if backend.device.type == "cpu":
        return SyncRunner()
    try:
        return StreamRunner(backend.device)
    except (AttributeError, RuntimeError, TypeError):  # a device module without streams
        return SyncRunner()


def count_call(backend: Backend, name: str, layer: int | None) -> None:
    """Count a device call exactly as ``Backend.call`` does (without running/synchronising it)."""
    backend.calls_by_name[name] += 1
    if layer is not None:
        backend.calls_by_layer[layer] += 1


class _JoinDevice(torch.autograd.Function):
    """Joins the asynchronously computed device result into this thread's autograd graph.

    The device call ran (on a side stream or thread) on detached leaves ``x̂, r̂`` with grad
    enabled, building its own small graph ``y(x̂, r̂)``. This node is created on the caller's
    thread *after* the cold experts, at the place where the sequential function creates the
    device call's nodes, so autograd runs the two branches and accumulates their gradients into
    the block input in the same order as the sequential function (bitwise-equal gradients).
    Backward: ``torch.autograd.grad(y, [x̂, r̂], dy)`` then device → host and the host dtypes
    (what the sequential ``to_device``/``.to(dtype)`` nodes do)."""

    @staticmethod
    def forward(ctx: Any, x_EhBD: torch.Tensor, r_EhB: torch.Tensor, res: tuple) -> torch.Tensor:  # type: ignore[override]
        y = res[2]
        ctx.res = res
        ctx.x_meta = (x_EhBD.device, x_EhBD.dtype)
        ctx.r_meta = (r_EhB.device, r_EhB.dtype)
        return y.detach()

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):  # type: ignore[override]
        x_hat, r_hat, y = ctx.res
        ctx.res = None
        gx, gr = torch.autograd.grad(y, [x_hat, r_hat], dy, allow_unused=True)
        if gx is not None:
            gx = gx.to(*ctx.x_meta)
        if gr is not None:
            gr = gr.to(*ctx.r_meta)
        return gx, gr, None


def _hot_inputs(
    x_TD: torch.Tensor,
    r_P: torch.Tensor,
    tok_P: torch.Tensor,
    src_EhB: torch.Tensor,
    Eh: int,
    Bk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense padded hot inputs (the sequential function's exact op sequence)."""
    T, D = x_TD.shape
    tok_ext = torch.cat([tok_P, torch.tensor([T])])
    x_ext_TD = torch.cat([x_TD, x_TD.new_zeros(1, D)])
    r_ext_P = torch.cat([r_P, r_P.new_zeros(1)])
    x_EhBD = x_ext_TD[tok_ext[src_EhB]].view(Eh, Bk, D)
    r_EhB = r_ext_P[src_EhB].view(Eh, Bk)
    return x_EhBD, r_EhB


def hot_cold_forward_overlapped(
    x_TD: torch.Tensor,
    gate: nn.Module,
    experts: nn.Module,
    hot: HotLayer,
    backend: Backend,
    layer: int,
    *,
    runner: AsyncRunner | None = None,
    on_device_s: Callable[[float], None] | None = None,
) -> torch.Tensor:
    """``hot_cold_forward`` with the hot device call issued before, and overlapped with, the cold
    experts on the host. Same outputs and gradients, bitwise (see module doc)."""
    runner = runner or runner_for(backend)
    T, D = x_TD.shape
    _, r_TK, idx_TK = gate(x_TD)  # stock router: fp32 softmax, top-k, renormalise
    K = idx_TK.shape[1]
    P = T * K
    e_P = idx_TK.reshape(-1)
    r_P = r_TK.reshape(-1)
    tok_P = torch.arange(P) // K
    slot_P = hot.slot_of_expert_E[e_P]
    is_hot_P = slot_P >= 0
    cold_Pc = (~is_hot_P).nonzero().squeeze(1)
    hot_Ph = is_hot_P.nonzero().squeeze(1)
    # the cold gathers first: the sequential function creates them before the hot ones
    if cold_Pc.numel():
        x_cold, e_cold, r_cold = x_TD[tok_P[cold_Pc]], e_P[cold_Pc, None], r_P[cold_Pc, None]

    # 1. hot pairs: dense padded values (no graph yet), issue the device call asynchronously
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
    needs_graph = torch.is_grad_enabled() and (x_TD.requires_grad or r_P.requires_grad)
    with torch.no_grad():
        xv, rv = _hot_inputs(x_TD.detach(), r_P.detach(), tok_P, src_EhB, Eh, Bk)
        x_dev = backend.to_device(xv.to(hot.device_dtype))
        r_dev = backend.to_device(rv.to(hot.device_dtype))

    def device_fn(x: torch.Tensor, r: torch.Tensor) -> tuple:
        if needs_graph:
            with torch.enable_grad():
                xh, rh = x.detach().requires_grad_(True), r.detach().requires_grad_(True)
                return xh, rh, hot.fn(xh, rh)
        with torch.no_grad():
            return None, None, hot.fn(x, r)

    count_call(backend, "hot_experts", layer)
    handle = runner.submit(device_fn, x_dev, r_dev)

    # 2. cold pairs on the host, meanwhile
    if cold_Pc.numel():
        y_cold = experts(x_cold, e_cold, r_cold)
    else:
        y_cold = x_TD.new_zeros(0, D)

    # 3. wait for the device; join its graph here (sequential order), back to the host, unpad
    t0 = time.perf_counter()
    res = runner.wait(handle)
    if needs_graph:
        x_EhBD, r_EhB = _hot_inputs(x_TD, r_P, tok_P, src_EhB, Eh, Bk)
        y_EhBD = _JoinDevice.apply(x_EhBD, r_EhB, res)
    else:
        y_EhBD = res[2]
    y_hot = backend.to_host(y_EhBD).to(x_TD.dtype).reshape(Eh * Bk, D)[dest_Ph]
    waited = time.perf_counter() - t0
    backend.call_s += waited
    if on_device_s is not None:
        on_device_s(waited)

    # 4. per-pair outputs back in pair order, then the stock top-k sum
    perm_P = torch.cat([cold_Pc, hot_Ph])
    inv_P = torch.empty_like(perm_P)
    inv_P[perm_P] = torch.arange(P)
    y_PD = torch.cat([y_cold.to(x_TD.dtype), y_hot])[inv_P]
    return y_PD.view(T, K, D).sum(dim=1)
