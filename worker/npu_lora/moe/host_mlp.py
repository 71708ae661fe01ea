"""HostMLP: a decoder layer's whole MoE block (router + experts) on the host, as one autograd node.

Legend (shape suffixes)::

    B batch   S sequence   T = B*S tokens   D hidden size   E experts of the layer

``HostMLP`` replaces ``layer.mlp`` (the HF decoder layer code is unchanged). It owns the block's
``gate`` and ``experts`` under the same attribute names, so parameter names and state dicts do
not change. Its forward moves the block input to the host (``backend.to_host``), casts it to the
host dtype, runs ``HostMLPFunction`` and moves the output back (``backend.to_device``).

``HostMLPFunction`` (``torch.autograd.Function``), with ``f`` = the block forward (the stock block,
or ``hot_cold_forward`` once hot experts exist) and ``θ`` = the block's trainable parameters
(expert weights under full fine-tuning, else none):

forward(x, θ) -> y = f(x; θ)
  - ``keep_graph=True``: runs ``f`` with grad enabled on ``x̂ = x.detach().requires_grad_()``
    and keeps ``(x, x̂, y)`` and the graph of ``f`` in the layer's single slot ``_kept``.
    Memory: the block's saved activations (router probs, gathered inputs, gate/up activations:
    ≈ T·K·(D + 3I) values in the host dtype for ``grouped_mm``) until this layer's backward.
    With hot experts the kept graph also holds the hot call's saved activations on the device.
    The slot holds at most one graph: a new forward of the layer replaces (frees) an abandoned
    one, and backward empties it.
  - ``keep_graph=False``: runs ``f`` under ``no_grad``; saves only ``x`` (already alive in the
    outer graph).

backward(dy) -> (dx, dθ):  dx = (∂y/∂x)ᵀ dy,  dθ = (∂y/∂θ)ᵀ dy
  - reuses the kept graph when the slot holds this forward's graph (token identity) *and* the
    backward's saved input is the very tensor the graph was built on (``is`` + version check);
    otherwise (keep_graph off, or the graph was replaced) it recomputes ``y = f(x̂)`` with grad
    enabled (timed as ``recompute_s``; the hot-expert device call runs again and is counted);
  - then ``torch.autograd.grad(y, [x̂, *θ], dy)``. Choice: the parameter gradients are *returned*
    through the Function (θ are Function inputs) instead of ``y.backward(dy)`` accumulating into
    ``.grad`` inside backward: the outer autograd engine then accumulates them (AccumulateGrad),
    so hooks, ``torch.autograd.grad(loss, params)`` and gradient accumulation behave exactly as
    with the stock block, and the result is bitwise equal to it.

Threads: for a host-only block on the ``npu_lora_stream`` kernel (``HostMLP.small_ops``) the
forward, the recompute and ``torch.autograd.grad`` run under ``moe.threads.small_ops`` (one
intra-op thread for the router, casts and routing bookkeeping; the kernel's calls get every
thread back), bitwise the same results (tested) without the small ops' thread stalls.

Timings (``time.perf_counter``, device work synchronised inside ``Backend.call``), accumulated
into the shared ``HostTimes``: ``host_fwd_s`` (forward incl. transfers and the hot device call),
``host_bwd_s`` (whole backward incl. recompute), ``recompute_s``; ``hot_s`` the hot device calls.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from npu_lora.backends.base import Backend
from npu_lora.moe.hot import HotLayer, hot_cold_forward
from npu_lora.moe.mode import EngineMode, FixedMode, ModeSource
from npu_lora.moe.overlap import hot_cold_forward_overlapped, runner_for
from npu_lora.moe.stream import NAME as STREAM
from npu_lora.moe.threads import small_ops


@dataclass
class HostTimes:
    """Accumulator that HostMLP adds its wall times to (seconds, ``time.perf_counter``)."""

    host_fwd_s: float = 0.0
    host_bwd_s: float = 0.0  # includes recompute_s
    recompute_s: float = 0.0
    hot_s: float = (
        0.0  # part of host_fwd_s + host_bwd_s spent in forward-direction hot-expert device calls
    )

    def reset(self) -> None:
        self.host_fwd_s = self.host_bwd_s = self.recompute_s = self.hot_s = 0.0


@dataclass
class _Kept:
    token: object
    x: torch.Tensor  # the Function's input (identity check)
    version: int
    x_hat: torch.Tensor  # detached leaf the graph starts from
    y: torch.Tensor  # graph output


class HostMLPFunction(torch.autograd.Function):
    """See the module docstring for the forward/backward formulas and what is saved."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mlp: HostMLP, *params: torch.Tensor) -> torch.Tensor:
        ctx.mlp = mlp
        ctx.params = params  # the trainable block parameters θ (references, no copy)
        ctx.save_for_backward(x)
        t0 = time.perf_counter()
        if mlp.keep_graph:
            with torch.enable_grad(), small_ops(mlp.small_ops):
                x_hat = x.detach().requires_grad_(True)
                y = mlp.block_forward(x_hat, count=True)
            ctx.token = object()
            mlp._kept = _Kept(ctx.token, x, x._version, x_hat, y)  # frees an abandoned graph
            out = y.detach()
        else:
            ctx.token = None
            with torch.no_grad(), small_ops(mlp.small_ops):
                out = mlp.block_forward(x, count=True)
        mlp.times.host_fwd_s += time.perf_counter() - t0
        return out

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        mlp: HostMLP = ctx.mlp
        (x,) = ctx.saved_tensors
        t0 = time.perf_counter()
        kept = mlp._kept
        if kept is not None and kept.token is ctx.token:
            mlp._kept = None  # free the slot as soon as this layer's backward runs
        reuse = (
            kept is not None
            and kept.token is ctx.token
            and kept.x is x
            and kept.version == x._version
        )
        if reuse:
            x_hat, y = kept.x_hat, kept.y
            mlp.reused += 1
        else:
            t1 = time.perf_counter()
            with torch.enable_grad(), small_ops(mlp.small_ops):
                x_hat = x.detach().requires_grad_(True)
                y = mlp.block_forward(x_hat, count=False)
            mlp.times.recompute_s += time.perf_counter() - t1
            mlp.recomputed += 1
        del kept
        with small_ops(mlp.small_ops):
            grads = torch.autograd.grad(y, [x_hat, *ctx.params], grad_y, allow_unused=True)
        mlp.backend.synchronize()
        mlp.times.host_bwd_s += time.perf_counter() - t0
        return (grads[0], None, *grads[1:])


class HostMLP(nn.Module):
    """Drop-in replacement of a Qwen3-MoE ``layer.mlp`` running on the host.

    Args:
        block: the stock MoE block (``gate`` → ``(logits, weights, indices)``, ``experts(x, idx, w)``).
        layer: decoder layer index (for device-call counting and routing counts).
        backend: the device seam (``to_host``/``to_device``/``call``).
        mode: where the engine mode is read (the engine, ``moe/mode.py``); alone (``None``), a
            fixed mode of ``keep_graph`` and ``overlap``.
        keep_graph: keep the block's graph from forward to backward (see module doc); only
            without ``mode``.
        times: shared timing accumulator (one per engine).
        counts_LE: shared ``[L, E] int64`` routing counts (forward passes only, not recomputes;
            every token including padding: all of them are computed).
        host_dtype: dtype of the block's weights and compute (input/output are cast).
        compute_dtype: dtype of the block's activations and router (default ``host_dtype``):
            float32 with bf16 expert weights on a CPU without native bf16 (the router weight is
            cast to it here; the experts kernel takes fp32 activations with bf16 weights).
        overlap: with hot experts on a non-CPU device, issue the hot call asynchronously and
            compute the cold experts meanwhile (``moe/overlap.py``; spec ``moe.overlap``);
            ``False`` (default) runs the synchronised sequential ``hot_cold_forward``; only
            without ``mode``.
    """

    def __init__(
        self,
        block: nn.Module,
        *,
        layer: int,
        backend: Backend,
        mode: ModeSource | None = None,
        keep_graph: bool = True,
        times: HostTimes | None = None,
        counts_LE: torch.Tensor | None = None,
        host_dtype: torch.dtype | None = None,
        compute_dtype: torch.dtype | None = None,
        overlap: bool = False,
    ) -> None:
        super().__init__()
        self.gate = block.gate
        self.experts = block.experts
        object.__setattr__(self, "_block", block)  # stock forward; shares gate/experts
        self.layer = layer
        self.backend = backend
        self._mode = (
            mode
            if mode is not None
            else FixedMode(
                EngineMode(placement="host-only", keep_graph=keep_graph, overlap=overlap)
            )
        )
        self.times = times if times is not None else HostTimes()
        self.counts_LE = counts_LE
        self.host_dtype = host_dtype or block.experts.gate_up_proj.dtype
        self.set_compute_dtype(compute_dtype or self.host_dtype)
        self.hot: HotLayer | None = None
        self._kept: _Kept | None = None
        #: ``moe.keepGraph`` omitted (auto) turns it off in the layers whose kept graph does not fit
        #: the memory budget (they recompute in backward whatever the engine mode says)
        self.keep_graph_fits = True
        self._count = False
        self.reused = 0
        self.recomputed = 0
        #: seam of the expert compute: ``None`` (the experts module), or a pass object
        #: (``moe/node_pass.py``) whose ``module(experts, layer)`` stands in for the experts call
        self.expert_pass: Any = None
        self.gate.register_forward_hook(self._count_hook)

    def set_compute_dtype(self, dtype: torch.dtype) -> None:
        """Run the block's activations and router in ``dtype`` (the router weight is cast; the
        expert weights stay in ``host_dtype``). Between steps only."""
        self.compute_dtype = dtype
        if any(p.dtype != dtype for p in self.gate.parameters()):
            self.gate.to(dtype)

    @property
    def keep_graph(self) -> bool:
        return self._mode.mode.keep_graph and self.keep_graph_fits

    @property
    def overlap(self) -> bool:
        return self._mode.mode.overlap

    @property
    def small_ops(self) -> bool:
        """Run the ops around the experts kernel on one thread (``moe/threads.py``): host-only
        blocks on the ``npu_lora_stream`` kernel (which keeps every thread)."""
        cfg = getattr(self.experts, "config", None)
        return self.hot is None and getattr(cfg, "_experts_implementation", None) == STREAM

    def _count_hook(self, _mod: nn.Module, _inp: Any, out: Any) -> None:
        if self._count and self.counts_LE is not None:
            idx = out[2].reshape(-1).detach().cpu()
            self.counts_LE[self.layer] += torch.bincount(idx, minlength=self.counts_LE.shape[1])

    def trainable_params(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def block_forward(self, x_BSD: torch.Tensor, *, count: bool) -> torch.Tensor:
        """``f``: the MoE block on the host in the compute dtype (stock block, or hot + cold)."""
        B, S, D = x_BSD.shape
        x = x_BSD.to(self.compute_dtype)
        self._count = count
        experts = self._experts_call()
        try:
            if self.hot is None:
                with _experts_swapped(self._block, experts):
                    y = self._block(x)
            else:
                args = (x.reshape(B * S, D), self.gate, experts, self.hot, self.backend)
                if self.backend.device.type == "cpu" or not self.overlap:  # sequential
                    y = hot_cold_forward(*args, self.layer, on_device_s=self._add_hot_s)
                else:  # issue the hot call asynchronously; cold experts on the host meanwhile
                    y = hot_cold_forward_overlapped(
                        *args, self.layer, runner=self._runner, on_device_s=self._add_hot_s
                    )
                y = y.view(B, S, D)
        finally:
            self._count = False
        return y.to(x_BSD.dtype)

    def _experts_call(self) -> nn.Module:
        """The expert compute of this layer: the experts module, or the pass's stand-in."""
        p = self.expert_pass
        return self.experts if p is None else p.module(self.experts, self.layer)

    @property
    def _runner(self):
        """The async runner for the overlapped hot call (one side stream per layer, made lazily)."""
        runner = self.__dict__.get("_runner_obj")
        if runner is None:
            runner = self.__dict__["_runner_obj"] = runner_for(self.backend)
        return runner

    def _add_hot_s(self, s: float) -> None:
        self.times.hot_s += s

    def free_kept(self) -> None:
        self._kept = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        x = self.backend.to_host(hidden_states, layer=self.layer)
        self.times.host_fwd_s += time.perf_counter() - t0
        params = self.trainable_params() if torch.is_grad_enabled() else []
        if torch.is_grad_enabled() and (x.requires_grad or params):
            y = HostMLPFunction.apply(x, self, *params)
        else:  # nothing to differentiate: no graph to keep, no Function node
            t1 = time.perf_counter()
            with small_ops(self.small_ops):
                y = self.block_forward(x, count=True)
            self.times.host_fwd_s += time.perf_counter() - t1
        t2 = time.perf_counter()
        out = self.backend.to_device(y, layer=self.layer)
        self.backend.synchronize()
        self.times.host_fwd_s += time.perf_counter() - t2
        return out


@contextlib.contextmanager
def _experts_swapped(block: nn.Module, experts: nn.Module) -> Iterator[None]:
    """The stock block calls ``experts`` in place of its own module (``expert_pass`` seam)."""
    own = block._modules["experts"]
    if experts is own:
        yield
        return
    block._modules["experts"] = experts
    try:
        yield
    finally:
        block._modules["experts"] = own


def install_host_mlp(
    model: nn.Module,
    backend: Backend,
    *,
    mode: ModeSource,
    times: HostTimes | None = None,
    counts_LE: torch.Tensor | None = None,
    compute_dtype: torch.dtype | None = None,
) -> list[HostMLP]:
    """Replace every decoder layer's ``mlp`` with a ``HostMLP`` (shared ``times``/``counts``;
    ``compute_dtype``: see :class:`HostMLP`)."""
    from npu_lora.models.build import decoder_layers

    layers = decoder_layers(model)
    times = times if times is not None else HostTimes()
    if counts_LE is None:
        E = layers[0].mlp.experts.gate_up_proj.shape[0]
        counts_LE = torch.zeros(len(layers), E, dtype=torch.int64)
    out = []
    for i, layer in enumerate(layers):
        mlp = layer.mlp
        if not isinstance(mlp, HostMLP):
            mlp = HostMLP(
                mlp,
                layer=i,
                backend=backend,
                mode=mode,
                times=times,
                counts_LE=counts_LE,
                compute_dtype=compute_dtype,
            )
            layer.mlp = mlp
        out.append(mlp)
    return out
