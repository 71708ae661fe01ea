"""The gloo process group and the training loop's per-step collectives.

Per optimizer step every rank runs, in this order (the same collectives on every rank):

1. ``all_reduce(SUM)`` of the label-token counts of the step's micro-batches (one int64 each):
   the loss of a micro-batch is the mean over the *global* batch's label tokens, so rank ``r``
   scales its micro-batch loss by ``n_r / N`` (with one rank: 1, today's loss);
2. forward/backward of its own shard (``TokenizedDataset.batch(..., rank=r, world=W)``);
3. ``all_reduce(SUM)`` of all trainable gradients, flattened into one fp32 buffer (its bytes
   and seconds are the record's ``allreduce_bytes`` / ``allreduce_s``); the result is the
   gradient of the global batch's loss, identical on every rank, so clipping and AdamW stay in
   step without a parameter broadcast. It is the step's first collective after the compute, so
   ``allreduce_s`` includes waiting for slower ranks: the transfer alone is about
   ``allreduce_s - (max(rank_compute_s) - rank_compute_s[0])``;
4. ``all_reduce(SUM)`` of the step's new routing counts (``[L, E]`` int64): every rank holds
   the global counts, so every rank picks the same hot set (and rank 0's checkpoint has them);
5. ``all_gather`` of ``[compute seconds, stop flag, loss share, tokens, streamed expert
   bytes]``: the step's global loss and tokens, the per-rank compute seconds (the skew), a stop
   (SIGTERM on any rank) that every rank honours after the same step, and the expert bytes the
   ranks of this rank's worker streamed (``node_expert_bytes``).

Start and resume: rank 0 (which alone owns the run directory) loads the checkpoint; then the
trainable parameters, AdamW state, RNG state, routing counts, hot set and the step are
broadcast from rank 0, so the other ranks need no access to the run directory.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from npu_lora.api import record as step_record
from npu_lora.api.v1alpha1 import EXIT_RENDEZVOUS_TIMEOUT
from npu_lora.distributed.env import RankInfo

#: Keys the loop adds to a step's record in a data-parallel run (after the record's columns;
#: a single-rank run's records have none of them): the record's data-parallel columns.
RECORD_KEYS = step_record.DATA_PARALLEL


class RendezvousTimeout(RuntimeError):
    """Not every rank joined the process group in time (exit code 4)."""

    exit_code = EXIT_RENDEZVOUS_TIMEOUT


def _resolve(addr: str, deadline: float) -> str:
    """``addr`` resolved to an IP address, retrying until ``deadline`` (pod 0's hostname
    appears in DNS only once pod 0 runs)."""
    last: Exception | None = None
    while True:
        try:
            return socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0][4][0]
        except OSError as e:
            last = e
        if time.monotonic() >= deadline:
            raise RendezvousTimeout(f"MASTER_ADDR {addr!r} did not resolve: {last}")
        time.sleep(0.5)


def init_group(info: RankInfo) -> None:
    """Join the gloo process group; :class:`RendezvousTimeout` after ``info.timeout_s``."""
    import torch.distributed as dist

    assert info.rank is not None
    deadline = time.monotonic() + info.timeout_s
    addr = _resolve(info.master_addr, deadline)
    left = max(1.0, deadline - time.monotonic())
    try:
        store = dist.TCPStore(
            addr,
            info.master_port,
            info.world_size,
            is_master=info.rank == 0,
            timeout=datetime.timedelta(seconds=left),
            wait_for_workers=True,
            use_libuv=True,
        )
        dist.init_process_group(
            "gloo",
            store=store,
            rank=info.rank,
            world_size=info.world_size,
            timeout=datetime.timedelta(seconds=max(info.timeout_s, 1800.0)),
        )
        dist.barrier()
    except RendezvousTimeout:
        raise
    except Exception as e:  # DistStoreError / RuntimeError
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "timed out" not in text.lower() and "timeout" not in text.lower():
            # e.g. the port is taken: an error (retried by the Job), not a missing rank
            raise RuntimeError(
                f"rank {info.rank}: cannot join the process group at "
                f"{info.master_addr}:{info.master_port}: {text}"
            ) from e
        raise RendezvousTimeout(
            f"rank {info.rank}: the {info.world_size} ranks did not all join the process group "
            f"at {info.master_addr}:{info.master_port} within "
            f"spec.distributed.rendezvousTimeoutSeconds ({info.timeout_s:g} s): {text}"
        ) from e


def destroy_group(*, synchronize: bool = False) -> None:
    """Tear the process group down. ``synchronize`` (every rank finished its run): a barrier
    first, so that no rank closes its gloo pairs while a peer is still in its last collective
    or its own teardown (a CI run once saw a rank abort at exit with "terminate called without an
    active exception", the symptom of gloo threads torn down under it); a failing barrier (a peer
    already gone) is ignored."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if synchronize:
        with contextlib.suppress(Exception):  # the peer left first: nothing to wait for
            dist.barrier()
    dist.destroy_process_group()


@dataclass
class StepComm:
    """What one step's collectives measured."""

    allreduce_s: float = 0.0
    allreduce_bytes: int = 0
    rank_compute_s: list[float] = field(default_factory=list)
    loss: float = 0.0
    tokens: int = 0
    stop: bool = False
    node_expert_bytes: int = 0  # streamed by the ranks of this rank's worker

    def record(self, world: int) -> dict[str, Any]:
        """The step record's data-parallel columns (:data:`RECORD_KEYS`, in that order)."""
        slow = max(range(len(self.rank_compute_s)), key=lambda r: self.rank_compute_s[r])
        values = {
            "world_size": world,
            "allreduce_s": self.allreduce_s,
            "allreduce_bytes": self.allreduce_bytes,
            "rank_compute_s": [round(x, 6) for x in self.rank_compute_s],
            "slowest_rank": slow,
            "skew_s": max(self.rank_compute_s) - min(self.rank_compute_s),
        }
        return {k: values[k] for k in RECORD_KEYS}


class DataParallel:
    """The loop's side of the process group (see the module docstring for the order)."""

    def __init__(self, info: RankInfo) -> None:
        assert info.rank is not None
        self.info = info
        self.rank = info.rank
        self.world = info.world_size

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def agree(self, value: str) -> str:
        """Rank 0's ``value`` on every rank (``moe.placement: auto``: each rank times its own
        trials, rank 0's choice is kept everywhere)."""
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])

    # -- 1: the loss weights ------------------------------------------------------------------
    def loss_weights(self, label_counts: list[int]) -> list[float]:
        """``n_r / N`` per micro-batch (``N``: the label tokens of all ranks' micro-batch)."""
        import torch
        import torch.distributed as dist

        local = torch.tensor(label_counts, dtype=torch.int64)
        total = local.clone()
        dist.all_reduce(total)
        return [
            (float(n) / float(t)) if int(t) > 0 else 1.0 / self.world
            for n, t in zip(local.tolist(), total.tolist(), strict=True)
        ]

    # -- 3: gradients -------------------------------------------------------------------------
    def reduce_gradients(self, params: list[Any]) -> tuple[int, float]:
        """Sum every parameter's gradient over the ranks (in place); ``(bytes, seconds)``."""
        import torch
        import torch.distributed as dist

        t0 = time.perf_counter()
        grads = [
            p.grad
            if p.grad is not None
            else torch.zeros_like(p, memory_format=torch.contiguous_format)
            for p in params
        ]
        flat = torch.cat([g.detach().reshape(-1).to("cpu", torch.float32) for g in grads])
        dist.all_reduce(flat)
        off = 0
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                n = g.numel()
                piece = flat[off : off + n].view_as(g).to(g.device, g.dtype)
                if p.grad is None:
                    p.grad = piece
                else:
                    p.grad.copy_(piece)
                off += n
        return flat.numel() * flat.element_size(), time.perf_counter() - t0

    # -- 4: routing counts --------------------------------------------------------------------
    def reduce_routing_counts(self, engine: Any, before_LE: Any) -> None:
        """Make the engine's counts the global counts: ``before + Σ_ranks (local - before)``."""
        import torch.distributed as dist

        try:
            now_LE = engine.hotset.routing_counts()
        except (AttributeError, NotImplementedError):
            return
        delta_LE = (now_LE - before_LE).contiguous()
        dist.all_reduce(delta_LE)
        engine.hotset.load_routing_counts(before_LE + delta_LE)

    # -- 5: step end --------------------------------------------------------------------------
    def step_end(
        self, compute_s: float, stop: bool, loss_share: float, tokens: int, expert_bytes: int = 0
    ) -> StepComm:
        import torch
        import torch.distributed as dist

        mine = torch.tensor(
            [compute_s, float(stop), loss_share, float(tokens), float(expert_bytes)],
            dtype=torch.float64,
        )
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(parts, mine)
        allv = torch.stack(parts)
        per = max(1, self.info.local_world)
        node = slice(self.rank // per * per, self.rank // per * per + per)
        return StepComm(
            node_expert_bytes=int(allv[node, 4].sum()),
            rank_compute_s=allv[:, 0].tolist(),
            stop=bool(allv[:, 1].max() > 0),
            loss=float(allv[:, 2].sum()),
            tokens=int(allv[:, 3].sum()),
        )

    # -- start / resume -----------------------------------------------------------------------
    def broadcast_start(self, engine: Any, optimizer: Any, state: dict[str, Any]) -> dict[str, Any]:
        """Rank 0's trainable parameters, AdamW, RNG, routing counts, hot set and ``state``
        (``done``, ``hot_info``, ...) on every rank; returns ``state`` as rank 0 has it."""
        import torch
        import torch.distributed as dist

        from npu_lora.train.checkpoint import rng_state, set_rng_state

        params = list(engine.adapter.parameters())
        payload: list[Any] = [None]
        if self.is_rank0:
            try:
                counts = engine.hotset.routing_counts()
            except (AttributeError, NotImplementedError):
                counts = None
            payload = [
                {
                    "params": [p.detach().to("cpu", copy=True) for p in params],
                    "optimizer": optimizer.state_dict(),
                    "rng": rng_state(),
                    "counts": counts,
                    "hot": engine.hot_state(),
                    "state": state,
                }
            ]
        dist.broadcast_object_list(payload, src=0)
        got = payload[0]
        if not self.is_rank0:
            with torch.no_grad():
                for p, t in zip(params, got["params"], strict=True):
                    p.copy_(t.to(device=p.device, dtype=p.dtype))
            optimizer.load_state_dict(got["optimizer"])
            if got["counts"] is not None:
                engine.hotset.load_routing_counts(got["counts"])
            if got["hot"] is not None:
                engine.load_hot_state(got["hot"])
            set_rng_state(got["rng"])
        return dict(got["state"])

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()
