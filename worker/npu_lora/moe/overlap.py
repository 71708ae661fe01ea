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

Engine hook: ``HostMLP`` calls ``hot_cold_forward_overlapped`` with ``runner_for(backend)``
when the backend's device is not the CPU (the ``cpu`` backend stays sequential).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import torch
from torch import nn

from npu_lora.backends.base import Backend
from npu_lora.moe.hot import (
    HotLayer,
    cold_inputs,
    combine,
    hot_inputs,
    plan_hot_cold,
    send_hot_inputs,
)


class AsyncRunner(Protocol):
    def submit(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    def wait(self, handle: Any) -> Any: ...

    def run_backward(self, fn: Callable[[], Any], *inputs: Any) -> Any: ...


class SyncRunner:
    """Runs the call at once (the host stands in for the device: nothing to overlap)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def wait(self, handle: Any) -> Any:
        return handle

    def run_backward(self, fn: Callable[[], Any], *inputs: Any) -> Any:
        return fn()


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

    def run_backward(self, fn: Callable[[], Any], *inputs: Any) -> Any:
        return fn()  # the caller's thread; the worker thread's results are complete

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

    def run_backward(self, fn: Callable[[], Any], *inputs: Any) -> Any:
        """Run the device call's backward on the side stream, ordered on both sides.

        Autograd runs each backward op on the stream its forward ran on (here the side
        stream), while the incoming gradient was produced, and the returned gradients are
        consumed (copied to the host), on the current stream. Without these waits the side
        stream can read ``dy`` before its copy finished, or the host copy read ``dx`` before it
        was written: measured on an H200 as input gradients that differed between two runs of
        the same step (tests/gpu)."""
        current = self.mod.current_stream(self.device)
        self.stream.wait_stream(current)  # dy (and anything before it) is ready
        for a in inputs:
            if isinstance(a, torch.Tensor) and a.device.type == self.device.type:
                a.record_stream(self.stream)
        with self.mod.stream(self.stream):
            out = fn()
        current.wait_stream(self.stream)  # the gradients are written before they are read
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.device.type == self.device.type:
                t.record_stream(current)
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
    Backward: ``torch.autograd.grad(y, [x̂, r̂], dy)`` through ``runner.run_backward`` (on a side
    stream: ordered after dy and before the copies of the result), then device → host and the host dtypes
    (what the sequential ``to_device``/``.to(dtype)`` nodes do)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x_EhBD: torch.Tensor,
        r_EhB: torch.Tensor,
        res: tuple,
        runner: AsyncRunner,
        backend: Backend,
        layer: int,
    ) -> torch.Tensor:
        y = res[2]
        ctx.res = res
        ctx.runner = runner
        ctx.backend, ctx.layer = backend, layer
        ctx.x_meta = (x_EhBD.device, x_EhBD.dtype)
        ctx.r_meta = (r_EhB.device, r_EhB.dtype)
        return y.detach()

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):  # type: ignore[override]
        x_hat, r_hat, y = ctx.res
        runner, ctx.res, ctx.runner = ctx.runner, None, None
        gx, gr = runner.run_backward(
            lambda: torch.autograd.grad(y, [x_hat, r_hat], dy, allow_unused=True), dy
        )
        be: Backend = ctx.backend
        if gx is not None:  # device → host through the seam (counted)
            gx = be.to_host(gx, layer=ctx.layer).to(*ctx.x_meta)
        if gr is not None:
            gr = be.to_host(gr, layer=ctx.layer).to(*ctx.r_meta)
        return gx, gr, None, None, None, None


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
    plan = plan_hot_cold(x_TD, gate, hot)
    # the cold gathers first: the sequential function creates them before the hot ones
    if plan.cold_Pc.numel():
        cold_args = cold_inputs(x_TD, plan)

    # 1. hot pairs: dense padded values (no graph yet), issue the device call asynchronously
    needs_graph = torch.is_grad_enabled() and (x_TD.requires_grad or plan.r_P.requires_grad)
    with torch.no_grad():
        xv, rv = hot_inputs(x_TD.detach(), plan.r_P.detach(), plan)
        x_dev, r_dev = send_hot_inputs(xv, rv, hot, backend, layer)

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
    if plan.cold_Pc.numel():
        y_cold = experts(*cold_args)
    else:
        y_cold = x_TD.new_zeros(0, x_TD.shape[1])

    # 3. wait for the device; join its graph here (sequential order), then combine
    t0 = time.perf_counter()
    res = runner.wait(handle)
    if needs_graph:
        x_EhBD, r_EhB = hot_inputs(x_TD, plan.r_P, plan)
        y_EhBD = _JoinDevice.apply(x_EhBD, r_EhB, res, runner, backend, layer)
    else:
        y_EhBD = res[2]
    y_TD = combine(y_cold, y_EhBD, x_TD, plan, backend)
    waited = time.perf_counter() - t0
    backend.call_s += waited
    if on_device_s is not None:
        on_device_s(waited)
    return y_TD
