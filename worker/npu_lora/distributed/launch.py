"""The worker's own launcher: ``npu-lora run`` with a world of more than one rank.

A launcher (one a pod; locally: one for the whole world) spawns its local ranks with
``torch.multiprocessing`` (start method ``spawn``: no forked torch/OpenMP state). Each rank
process gets the torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and runs the ordinary ``npu-lora run``
(:func:`npu_lora.commands.run.run`) as that rank. The launcher:

- forwards SIGTERM to every rank (they agree on the step to stop after; rank 0 checkpoints it);
- when one rank exits non-zero (or is killed), stops the others (SIGTERM, then SIGKILL after
  ``GRACE_S``) and exits with that rank's code (a signal ``k``: ``128 + k``), so no rank is left
  waiting in a collective; rerunning the same command resumes from the last checkpoint;
- never builds a model itself; with one local rank (a pod of an Indexed Job with
  ``ranksPerWorker: 1``) it spawns nothing and runs as that rank.

Host expert weights: the ranks of one launcher share one copy. Local rank 0 builds its engine
and moves the frozen expert tensors to shared memory in place (``Tensor.share_memory_()``) and
hands them to the other local ranks through a ``torch.multiprocessing`` queue (file
descriptors, no copy); each of those builds its engine (one at a time, under a lock, so the
transient peak is two copies, not one a rank), points its expert parameters at the shared
storage and drops its own copy. Not with ``lora.trainExperts`` (trained experts are per rank),
nor with ``NPU_LORA_SHARE_EXPERTS=0``.

One expert pass per node (``spec.distributed.sharedPass``, :func:`shared_pass_on`): with shared
expert weights the ranks also share the expert *compute*: the launcher makes the
:class:`~npu_lora.moe.node_pass.NodeLink` (a barrier and a shared header) and every rank
installs a :class:`~npu_lora.moe.node_pass.NodePass` on its layers (local rank 0 runs the
union). When a rank fails the launcher aborts the link's barrier before stopping the others, so
no rank waits in the pass for a peer that is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from npu_lora.distributed.env import RankInfo

GRACE_S = 20.0
#: ``NPU_LORA_SHARE_EXPERTS=0``: every rank keeps its own copy (for measuring the difference)
ENV_SHARE = "NPU_LORA_SHARE_EXPERTS"

# set in a rank process by _rank_main: (queue, lock, local_rank, local_world, link, timeout_s)
_SHARING: tuple[Any, Any, int, int, Any, float] | None = None


def _expert_params(engine: Any) -> list[Any]:
    from npu_lora.models.build import EXPERT_PARAM_NAMES

    mlps = getattr(engine, "mlps", None)
    if not mlps:
        return []
    return [getattr(m.experts, n) for m in mlps for n in EXPERT_PARAM_NAMES]


def shared_pass_on(spec: Any, local_world: int) -> bool:
    """``spec.distributed.sharedPass`` resolved for a launcher of ``local_world`` ranks."""
    mode = spec.distributed.shared_pass
    shared = local_world > 1 and not spec.lora.train_experts and os.environ.get(ENV_SHARE) != "0"
    if mode == "off" or not shared:
        return False
    return mode == "on" or spec.moe.experts_kernel == "npu_lora_stream"


def _install_node_pass(engine: Any, spec: Any) -> Any:
    sharing = _SHARING
    assert sharing is not None
    _, _, local_rank, local_world, link, timeout_s = sharing
    if link is None or not shared_pass_on(spec, local_world) or not getattr(engine, "mlps", None):
        return engine
    import torch

    from npu_lora.moe.node_pass import NodePass

    threads = min(os.cpu_count() or 1, torch.get_num_threads() * local_world)
    engine.use_expert_pass(
        NodePass(link, local_rank, local_world, timeout_s=timeout_s, threads=threads)
    )
    return engine


def build_shared(build: Any, spec: Any) -> Any:
    """``build()`` the engine; in a launcher's rank process share the expert weights (and,
    with ``sharedPass``, the expert compute)."""
    sharing = _SHARING
    if sharing is None or spec.lora.train_experts or os.environ.get(ENV_SHARE) == "0":
        return build()
    queue, lock, local_rank, local_world, _, _ = sharing
    if local_world <= 1:
        return build()
    if local_rank == 0:
        engine = build()
        shared = []
        for p in _expert_params(engine):
            p.data.share_memory_()
            shared.append(p.data)
        for _ in range(local_world - 1):
            queue.put(shared)
        return _install_node_pass(engine, spec)
    shared = queue.get()
    with lock:
        engine = build()
        own = _expert_params(engine)
        if len(own) != len(shared):
            raise RuntimeError(
                f"shared expert weights: local rank 0 has {len(shared)} tensors, this rank "
                f"{len(own)}"
            )
        import torch

        for i, (p, t) in enumerate(zip(own, shared, strict=True)):
            if p.shape != t.shape or p.dtype != t.dtype:
                raise RuntimeError(f"shared expert weights: tensor {i} differs in shape/dtype")
            if i < 2 and not torch.equal(p.data, t):  # the first layer: same weights
                raise RuntimeError("shared expert weights: local rank 0 built other weights")
        engine.share_expert_weights(list(zip(shared[0::2], shared[1::2], strict=True)))
        import gc

        gc.collect()
    return _install_node_pass(engine, spec)


def _rank_main(
    run: Callable[[argparse.Namespace], int],
    local_rank: int,
    info: RankInfo,
    args: argparse.Namespace,
    queue: Any,
    lock: Any,
    extra_env: dict[str, str],
    link: Any = None,
) -> None:
    global _SHARING
    me = info.for_local(local_rank)
    os.environ.update(me.child_env())
    os.environ.update(extra_env)
    _SHARING = (queue, lock, local_rank, info.local_world, link, float(info.timeout_s))
    _leave(run(args))


def _leave(code: int) -> None:
    """End a rank process that returned from its run without the interpreter's teardown.

    By now the run has closed what it wrote (metrics, checkpoint, adapter) and torn its process
    group down after a barrier (``group.destroy_group``). Finalization would still destroy the
    C++ objects behind torch's and gloo's threads, and a rank that finished could abort there
    ("terminate called without an active exception", exit 134): seen in 2 of 3 runs of
    ``tests/train`` on a 2-core host (2026-12-04), a failed run although every step was done. So:
    flush Python's buffers and logging, then ``os._exit``. An exception from the run takes the
    ordinary path (traceback, exit 1)."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(int(code or 0))


def _code(exitcode: int | None) -> int:
    if exitcode is None:
        return 1
    return 128 - exitcode if exitcode < 0 else exitcode


def launch(
    args: argparse.Namespace,
    info: RankInfo,
    spec: Any,
    run: Callable[[argparse.Namespace], int],
) -> int:
    """Spawn ``info.local_world`` ranks, each calling ``run(args)`` (``npu_lora.commands.run.run``,
    passed in: ``distributed`` sits below ``commands``; a module-level function, so it pickles
    for ``spawn``), wait; exit code as described in the module doc."""
    if info.local_world == 1:  # one rank a pod (e.g. an Indexed Job pod): be that rank
        os.environ.update(info.for_local(0).child_env())
        return run(args)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    lock = ctx.Lock()
    link = None
    if shared_pass_on(spec, info.local_world):
        from npu_lora.moe.node_pass import NodeLink

        link = NodeLink.create(ctx, info.local_world)
    extra: dict[str, str] = {}
    if info.master_addr in ("127.0.0.1", "localhost"):
        extra.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    if spec.moe.host_threads is None:
        # the launcher's cores split between its ranks (moe.hostThreads overrides)
        n = max(1, (os.cpu_count() or 1) // max(1, info.local_world))
        extra.setdefault("OMP_NUM_THREADS", str(n))
    procs = []
    for local in range(info.local_world):
        p = ctx.Process(
            target=_rank_main,
            args=(run, local, info, args, queue, lock, extra, link),
            name=f"npu-lora-rank{info.first_rank() + local}",
            daemon=False,
        )
        p.start()
        procs.append(p)
    print(
        f"npu-lora run: {info.local_world} ranks "
        f"{info.first_rank()}..{info.first_rank() + info.local_world - 1} of "
        f"{info.world_size} (rendezvous {info.master_addr}:{info.master_port})",
        file=sys.stderr,
    )

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.exitcode is None and p.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signum)

    old = signal.signal(signal.SIGTERM, forward)
    failed: int | None = None
    try:
        from multiprocessing.connection import wait

        alive = list(procs)
        while alive:
            wait([p.sentinel for p in alive], timeout=1.0)
            for p in list(alive):
                if p.exitcode is None:
                    continue
                alive.remove(p)
                code = _code(p.exitcode)
                if code != 0 and failed is None:
                    failed = code
                    print(
                        f"npu-lora run: {p.name} exited with code {code}; stopping the other ranks",
                        file=sys.stderr,
                    )
                    if link is not None:  # ranks waiting in the expert pass: fail now
                        link.abort()
                    _stop(alive)
    except KeyboardInterrupt:
        if link is not None:
            link.abort()
        _stop(procs)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
        queue.close()
        if link is not None:
            link.cleanup()
    return failed or 0


def _stop(procs: list[Any]) -> None:
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join(5.0)
