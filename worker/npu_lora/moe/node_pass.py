"""One expert pass per node: the local ranks of a launcher hand their routed tokens to one host
pass over the union, so the node reads each hit expert's weights once per layer and direction.

Legend (shape suffixes)::

    T tokens of one rank's call   U = Σ_r T_r tokens of the union   H hidden size   K experts/token

Without it every rank of a pod (``spec.distributed.ranksPerWorker``; the ranks already share one
copy of the frozen expert weights, ``distributed/launch.py``) runs the experts kernel on its own
tokens and streams every hit expert's weights itself: a node of R ranks reads them R times.

Design: a **single executor**. Local rank 0 runs the model's own experts kernel once on the
union of every local rank's ``(x [T, H], top_k_index [T, K], top_k_weights [T, K])`` of the
layer (rank order, rank 0 first), with the threads of all local ranks (``threads``: the node's
share, set around the kernel call only), and keeps the union's autograd graph per layer; its
backward takes every rank's ``dL/dy`` rows, runs one ``autograd.grad`` over the union and
returns each rank its ``dx`` and ``dw`` rows. The other ranks wait meanwhile (blocked on a
semaphore, no CPU). Why not the expert-partitioned cooperative pass: the streaming kernel
already spreads a call's (hit expert, row block) tasks over any number of threads, and one
executor's result is, row for row, the kernel's own result; a cooperative pass would have to
split the per-token sum over the K slots across processes and redo it in the kernel's order.

Determinism: ``npu_lora_stream`` computes every token's row with work that depends only on that
row and the expert weights (task lists depend on shapes, slots summed in fixed order), so a
token's output and gradients in the union are bitwise those of its rank computing alone
(``tests/moe/test_node_pass.py``). Other kernels (``grouped_mm``: GEMM blocking depends on the
row count) are correct but not bitwise batch-invariant, so ``sharedPass: auto`` uses the pass
with ``npu_lora_stream`` only.

Transport (latency first): per non-executor rank one shared-memory segment (a file in
``/dev/shm`` mapped by both, ``torch.from_file(shared=True)``; grown by its owner when a call
carries more tokens, the executor re-maps it and unlinks the name), a shared ``int64`` header
``[R, 3]`` (tokens, segment generation, capacity) and a barrier on a shared ``int64`` vector (one
counter a rank, spin then sleep: :class:`NodeLink`): two barrier waits per layer and direction,
no sockets, no pickling, and the payload is copied once each way (inputs in, rows out). The
barrier costs tens to hundreds of microseconds,
against tens of milliseconds a pass (``experiments/2026-12-03-node-pass.md``).

Liveness: every wait has the rendezvous timeout (``spec.distributed.rendezvousTimeoutSeconds``);
a stalled rank makes the others raise :class:`NodePassTimeout` (exit code 4, like a missing
rank at the rendezvous). When a rank dies the launcher aborts the barrier before stopping the
others, so the waiting ranks raise :class:`NodePassBroken` at once: never a hang.

Counted bytes: ``streamed_bytes`` adds, per kernel call made by *this* process, the hit
experts' weight bytes (:func:`npu_lora.moe.experts.hit_expert_bytes`) once per direction.
Executor: the union's; the other ranks: none. :class:`LocalPass` counts the same for a rank
that streams alone, so the per-node sum is ``∝ 1`` with the pass and ``∝ ranks`` without.
"""

from __future__ import annotations

import contextlib
import glob
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from npu_lora.api.v1alpha1 import EXIT_RENDEZVOUS_TIMEOUT
from npu_lora.models.quant import expert_nbytes
from npu_lora.moe.experts import hit_expert_bytes

__all__ = [
    "LocalPass",
    "NodeLink",
    "NodePass",
    "NodePassBroken",
    "NodePassTimeout",
    "arm",
    "disarm",
    "install_pass",
]

#: ``/dev/shm`` file prefix of the segments (``<prefix>-<rank>-<generation>``)
SHM_DIR = "/dev/shm"


class NodePassBroken(RuntimeError):
    """A local rank left the node expert pass (died or failed); exit code 1."""

    exit_code = 1


class NodePassTimeout(NodePassBroken):
    """A local rank did not reach the node expert pass in time (exit code 4)."""

    exit_code = EXIT_RENDEZVOUS_TIMEOUT


class _Broken(Exception):
    pass


class _TimedOut(Exception):
    pass


@dataclass
class NodeLink:
    """What a launcher hands each of its ranks (picklable for ``spawn``).

    ``sync`` is the barrier: ``[R + 1]`` int64 in shared memory, slot ``r`` the number of waits
    rank ``r`` has entered, the last slot the abort flag. Each slot has one writer, so no atomic
    read-modify-write is needed (aligned 8-byte stores are atomic and, on x86-64, seen in program
    order after the staging writes before them). Why not ``multiprocessing.Barrier``: its
    condition variable makes the last arriving process (and ``abort``) wait for every registered
    sleeper to acknowledge its wake-up, so a rank killed while asleep in it hangs the others and
    the launcher for good.
    """

    header: torch.Tensor  # [local_world, 3] int64 in shared memory: tokens, generation, capacity
    sync: torch.Tensor  # [local_world + 1] int64 in shared memory: entered waits; abort flag
    prefix: str  # segment file prefix, unique per launcher

    @classmethod
    def create(cls, ctx: Any, local_world: int) -> NodeLink:
        """``ctx``: the launcher's multiprocessing context (unused: the link is tensors)."""
        header = torch.zeros(local_world, 3, dtype=torch.int64).share_memory_()
        sync = torch.zeros(local_world + 1, dtype=torch.int64).share_memory_()
        return cls(header, sync, f"npu-lora-pass-{os.getpid()}")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_view"}  # the tensors share

    def abort(self) -> None:
        """Break the barrier: every waiting rank raises :class:`NodePassBroken` at once."""
        self.sync[-1] = 1

    def wait(self, rank: int, timeout_s: float) -> None:
        """Barrier of the local ranks: returns once every rank entered as many waits as this
        one; spins ~50 µs, then sleeps in steps doubling to 1 ms (the other ranks sleep through
        the executor's pass, so waiting must not take a core). Raises ``_Broken`` (aborted) or
        ``_TimedOut``."""
        view = self.__dict__.get("_view")
        if view is None:
            view = self.__dict__["_view"] = self.sync.numpy()
        epoch = int(view[rank]) + 1
        view[rank] = epoch
        n = len(view) - 1
        t0 = time.monotonic()
        nap = 0.0
        spins = 0
        while True:
            if view[n]:
                raise _Broken
            if int(view[:n].min()) >= epoch:
                return
            spins += 1
            if spins < 50:
                continue
            if time.monotonic() - t0 > timeout_s:
                raise _TimedOut
            nap = min(1e-3, nap * 2 if nap else 2e-5)
            time.sleep(nap)

    def cleanup(self) -> None:
        """Unlink segments left behind (a rank died before the executor mapped them)."""
        for path in glob.glob(os.path.join(SHM_DIR, self.prefix + "-*")):
            with contextlib.suppress(OSError):
                os.unlink(path)


class _Segment:
    """One rank's staging buffers: ``a`` [C, H] fp32 (x forward, dL/dy backward), ``b`` [C, H]
    fp32 (y forward, dx backward), ``w`` [C, K] fp32 (weights in, dw out), ``idx`` [C, K] int64.
    fp32 holds fp32, bf16 and fp16 values exactly, so staging never rounds. (The header row of
    rank 0, which has no segment, carries the backward's flags: dx sent, dw sent.)"""

    def __init__(self, path: str, cap: int, H: int, K: int, *, create: bool) -> None:
        f32 = cap * (2 * H + K)
        idx_bytes = -(-cap * K * 8 // 64) * 64  # int64 first: every region stays aligned
        nbytes = idx_bytes + f32 * 4
        if create:
            with open(path, "wb") as f:
                f.truncate(nbytes)
        raw = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        self.idx = raw[: cap * K * 8].view(torch.int64).view(cap, K)
        fl = raw[idx_bytes:].view(torch.float32)
        self.a = fl[: cap * H].view(cap, H)
        self.b = fl[cap * H : 2 * cap * H].view(cap, H)
        self.w = fl[2 * cap * H :].view(cap, K)
        self.cap, self.H, self.K = cap, H, K


class _PassExperts(nn.Module):
    """Stands in for a layer's experts module: ``(x [T,H], idx [T,K], w [T,K]) -> y [T,H]``."""

    def __init__(self, owner: Any, experts: nn.Module, layer: int) -> None:
        super().__init__()
        object.__setattr__(self, "inner", experts)  # not registered: names stay the stock ones
        object.__setattr__(self, "owner", owner)
        self.layer = layer

    def forward(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.owner.call(self.inner, self.layer, x, idx, w)


class LocalPass:
    """The experts kernel of this rank alone, counting its streamed bytes (see module doc)."""

    def __init__(self) -> None:
        self.streamed_bytes = 0
        self.active = True
        self._mods: dict[int, _PassExperts] = {}

    def module(self, experts: nn.Module, layer: int) -> nn.Module:
        m = self._mods.get(layer)
        if m is None or m.inner is not experts:
            m = self._mods[layer] = _PassExperts(self, experts, layer)
        return m

    def _add(self, nbytes: int) -> None:
        self.streamed_bytes += nbytes

    def call(
        self, experts: nn.Module, layer: int, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        y = experts(x, idx, w)
        nbytes = hit_expert_bytes(
            idx, experts.gate_up_proj, experts.down_proj, expert_nbytes(experts)
        )
        self.streamed_bytes += nbytes
        if y.requires_grad:  # the backward streams the hit experts once more
            y.register_hook(lambda _g: self._add(nbytes))
        return y


@dataclass
class _Graph:
    x_U: torch.Tensor
    w_U: torch.Tensor
    y_U: torch.Tensor
    idx_U: torch.Tensor
    rows: list[int]  # tokens per local rank
    nbytes: int  # the union's hit experts' weight bytes


class _NodePassFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        w: torch.Tensor,
        idx: torch.Tensor,
        npass: NodePass,
        layer: int,
        experts: nn.Module,
    ) -> torch.Tensor:
        ctx.npass, ctx.layer = npass, layer
        ctx.x_dtype, ctx.w_dtype = x.dtype, w.dtype
        need = ctx.needs_input_grad
        return npass._forward(experts, layer, x, idx, w, graph=(need[0], need[1]))

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor):  # type: ignore[override]
        dx, dw = ctx.npass._backward(ctx.layer, grad_y)
        dx = dx.to(ctx.x_dtype) if dx is not None else None
        dw = dw.to(ctx.w_dtype) if dw is not None else None
        return dx, dw, None, None, None, None


class NodePass(LocalPass):
    """The node's single expert pass (module doc). ``active`` only while armed (the engine's
    training micro-batch, which every local rank runs in lockstep); otherwise (rank 0's
    evaluation, inference) each rank computes alone like :class:`LocalPass`."""

    def __init__(
        self, link: NodeLink, local_rank: int, local_world: int, *, timeout_s: float, threads: int
    ) -> None:
        super().__init__()
        self.link = link
        self.rank = local_rank
        self.world = local_world
        self.timeout_s = float(timeout_s)
        self.threads = max(1, int(threads))
        self.active = False
        self.waits = 0
        self.wait_s = 0.0
        self._own: _Segment | None = None
        self._gen = 0
        self._peers: dict[int, tuple[int, _Segment]] = {}
        self._graphs: dict[int, _Graph] = {}

    # -- plumbing -----------------------------------------------------------------------------
    def _wait(self, what: str, layer: int) -> None:
        t0 = time.monotonic()
        where = f"local rank {self.rank}, layer {layer} {what}"
        try:
            self.link.wait(self.rank, self.timeout_s)
        except _TimedOut:
            raise NodePassTimeout(
                f"{where}: not every local rank reached the node expert pass within "
                f"spec.distributed.rendezvousTimeoutSeconds ({self.timeout_s:g} s)"
            ) from None
        except _Broken:
            raise NodePassBroken(f"{where}: a local rank left the node expert pass") from None
        self.waits += 1
        self.wait_s += time.monotonic() - t0

    def _segment(self, T: int, H: int, K: int) -> _Segment:
        seg = self._own
        if seg is None or seg.cap < T or seg.H != H or seg.K != K:
            self._gen += 1
            cap = max(T, 2 * seg.cap if seg is not None and seg.H == H and seg.K == K else T)
            path = os.path.join(SHM_DIR, f"{self.link.prefix}-{self.rank}-{self._gen}")
            seg = self._own = _Segment(path, cap, H, K, create=True)
        return seg

    def _peer(self, r: int, H: int, K: int) -> tuple[int, _Segment]:
        T, gen, cap = (int(v) for v in self.link.header[r].tolist())
        have = self._peers.get(r)
        if have is None or have[0] != gen:
            path = os.path.join(SHM_DIR, f"{self.link.prefix}-{r}-{gen}")
            seg = _Segment(path, cap, H, K, create=False)
            with contextlib.suppress(OSError):
                os.unlink(path)  # both sides have it mapped: the name is not needed any more
            have = self._peers[r] = (gen, seg)
        return T, have[1]

    @contextlib.contextmanager
    def _node_threads(self) -> Iterator[None]:
        own = torch.get_num_threads()
        if own != self.threads:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            if own != self.threads:
                torch.set_num_threads(own)

    # -- the pass -----------------------------------------------------------------------------
    def call(
        self, experts: nn.Module, layer: int, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        if not self.active:
            return super().call(experts, layer, x, idx, w)
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            return _NodePassFunction.apply(x, w, idx, self, layer, experts)
        return self._forward(experts, layer, x, idx, w, graph=None)

    def _forward(
        self,
        experts: nn.Module,
        layer: int,
        x_TH: torch.Tensor,
        idx_TK: torch.Tensor,
        w_TK: torch.Tensor,
        *,
        graph: tuple[bool, bool] | None,
    ) -> torch.Tensor:
        T, H = x_TH.shape
        K = idx_TK.shape[1]
        if self.rank != 0:
            seg = self._segment(T, H, K)
            seg.a[:T].copy_(x_TH)
            seg.w[:T].copy_(w_TK)
            seg.idx[:T].copy_(idx_TK)
            self.link.header[self.rank] = torch.tensor([T, self._gen, seg.cap])
            self._wait("forward", layer)  # 1: inputs staged
            self._wait("forward", layer)  # 2: the executor wrote the rows
            return seg.b[:T].to(x_TH.dtype, copy=True)
        self._wait("forward", layer)
        rows, xs, ids, ws, segs = [T], [x_TH.detach()], [idx_TK], [w_TK.detach()], []
        for r in range(1, self.world):
            Tr, seg = self._peer(r, H, K)
            rows.append(Tr)
            segs.append(seg)
            xs.append(seg.a[:Tr].to(x_TH.dtype))
            ids.append(seg.idx[:Tr])
            ws.append(seg.w[:Tr].to(w_TK.dtype))
        x_UH, idx_UK, w_UK = torch.cat(xs), torch.cat(ids).to(idx_TK.dtype), torch.cat(ws)
        nbytes = hit_expert_bytes(
            idx_UK, experts.gate_up_proj, experts.down_proj, expert_nbytes(experts)
        )
        with self._node_threads():
            if graph is None:
                with torch.no_grad():
                    y_UH = experts(x_UH, idx_UK, w_UK)
            else:
                with torch.enable_grad():
                    x_UH.requires_grad_(graph[0])
                    w_UK.requires_grad_(graph[1])
                    y_UH = experts(x_UH, idx_UK, w_UK)
                self._graphs[layer] = _Graph(x_UH, w_UK, y_UH, idx_UK, rows, nbytes)
        self.streamed_bytes += nbytes
        y = y_UH.detach()
        off = T
        for seg, Tr in zip(segs, rows[1:], strict=True):
            seg.b[:Tr].copy_(y[off : off + Tr])
            off += Tr
        self._wait("forward", layer)
        return y[:T].clone()

    def _backward(
        self, layer: int, grad_TH: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        T, H = grad_TH.shape
        if self.rank != 0:
            seg = self._own
            assert seg is not None and seg.cap >= T
            seg.a[:T].copy_(grad_TH)
            self.link.header[self.rank, 0] = T
            self._wait("backward", layer)
            self._wait("backward", layer)
            need_x, need_w = (bool(v) for v in self.link.header[0, 1:].tolist())
            dx = seg.b[:T].clone() if need_x else None
            dw = seg.w[:T].clone() if need_w else None
            return dx, dw
        self._wait("backward", layer)
        g = self._graphs.pop(layer, None)
        if g is None:
            raise NodePassBroken(
                f"layer {layer}: backward of the node expert pass without its forward"
            )
        K = g.idx_U.shape[1]
        gs = [grad_TH]
        segs = []
        for r in range(1, self.world):
            Tr, seg = self._peer(r, H, K)
            if Tr != g.rows[r]:
                raise NodePassBroken(
                    f"layer {layer}: rank {r} sent {Tr} rows, forward had {g.rows[r]}"
                )
            gs.append(seg.a[:Tr])
            segs.append(seg)
        grad_UH = torch.cat([t.to(g.y_U.dtype) for t in gs])
        inputs = [t for t in (g.x_U, g.w_U) if t.requires_grad]
        with self._node_threads():
            grads = list(torch.autograd.grad(g.y_U, inputs, grad_UH, allow_unused=True))
        self.streamed_bytes += g.nbytes  # the backward streams the union's hit experts again
        dx_UH = grads.pop(0) if g.x_U.requires_grad else None
        dw_UK = grads.pop(0) if g.w_U.requires_grad else None
        if dw_UK is None and g.w_U.requires_grad:
            dw_UK = torch.zeros_like(g.w_U)
        self.link.header[0, 1] = int(dx_UH is not None)
        self.link.header[0, 2] = int(dw_UK is not None)
        off = T
        for seg, Tr in zip(segs, g.rows[1:], strict=True):
            if dx_UH is not None:
                seg.b[:Tr].copy_(dx_UH[off : off + Tr])
            if dw_UK is not None:
                seg.w[:Tr].copy_(dw_UK[off : off + Tr])
            off += Tr
        self._wait("backward", layer)
        dx = dx_UH[:T].clone() if dx_UH is not None else None
        dw = dw_UK[:T].clone() if dw_UK is not None else None
        return dx, dw


def install_pass(mlps: list[Any], npass: LocalPass) -> LocalPass:
    """Route every layer's expert compute through ``npass`` (HostMLP's ``expert_pass`` seam)."""
    for m in mlps:
        m.expert_pass = npass
    return npass


def _passes(mlps: list[Any]) -> list[LocalPass]:
    return list({id(p): p for m in mlps if (p := m.expert_pass) is not None}.values())


def arm(mlps: list[Any]) -> int:
    """Start of a training micro-batch (every local rank runs it in lockstep): a
    :class:`NodePass` serves the layers until :func:`disarm`. Returns the bytes streamed so far."""
    for p in _passes(mlps):
        p.active = True
    return sum(p.streamed_bytes for p in _passes(mlps))


def disarm(mlps: list[Any]) -> int:
    """End of the micro-batch; returns the bytes streamed so far (see :func:`arm`)."""
    for p in _passes(mlps):
        if isinstance(p, NodePass):
            p.active = False
    return sum(p.streamed_bytes for p in _passes(mlps))
