"""Who this process is in the data-parallel world (pure: spec + environment → :class:`RankInfo`).

Environment read (all optional):

- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (+ ``LOCAL_WORLD_SIZE``): set by torchrun or by our
  own launcher for each rank process: this process *is* that rank (nothing is spawned);
- ``JOB_COMPLETION_INDEX`` (an Indexed Job's pod index, set by Kubernetes): the node rank; the
  pod's launcher spawns ``ranksPerWorker`` ranks. Without it (a local ``npu-lora run``) one
  launcher spawns every rank of the world on this machine;
- ``MASTER_ADDR`` / ``MASTER_PORT``: where rank 0's rendezvous listens (the operator sets the
  stable hostname of pod 0 through the run's headless Service; local: 127.0.0.1 and
  ``spec.distributed.port``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_NODE_RANK = "JOB_COMPLETION_INDEX"
LOCAL_MASTER = "127.0.0.1"


@dataclass(frozen=True)
class RankInfo:
    """One rank (``rank is None``: a launcher that spawns ``local_world`` ranks)."""

    world_size: int
    workers: int
    ranks_per_worker: int
    node_rank: int
    local_world: int  # ranks this launcher (pod) runs
    master_addr: str
    master_port: int
    timeout_s: float
    rank: int | None = None
    local_rank: int | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_rank0(self) -> bool:
        return not self.rank

    def first_rank(self) -> int:
        """Global rank of this launcher's local rank 0."""
        return self.node_rank * self.ranks_per_worker

    def for_local(self, local_rank: int) -> RankInfo:
        from dataclasses import replace

        return replace(self, rank=self.first_rank() + local_rank, local_rank=local_rank)

    def child_env(self) -> dict[str, str]:
        """The torchrun-style environment of this rank's process."""
        assert self.rank is not None and self.local_rank is not None
        return {
            ENV_RANK: str(self.rank),
            ENV_WORLD_SIZE: str(self.world_size),
            ENV_LOCAL_RANK: str(self.local_rank),
            ENV_LOCAL_WORLD_SIZE: str(self.local_world),
            ENV_MASTER_ADDR: self.master_addr,
            ENV_MASTER_PORT: str(self.master_port),
        }


def _int(env: Mapping[str, str], key: str) -> int | None:
    v = env.get(key, "").strip()
    if not v:
        return None
    try:
        return int(v)
    except ValueError:
        from npu_lora.api.load import SpecError

        raise SpecError(f"environment {key}={v!r}: not an integer") from None


def rank_info(spec: Any, env: Mapping[str, str] | None = None) -> RankInfo:
    """The rank (or launcher) this process is, from ``spec.distributed`` and ``env``."""
    from npu_lora.api.load import SpecError

    env = os.environ if env is None else env
    d = spec.distributed
    workers = d.workers if d is not None else 1
    per = d.ranks(spec.device.cards) if d is not None else 1
    timeout = float(d.rendezvous_timeout_seconds) if d is not None else 300.0
    port = _int(env, ENV_MASTER_PORT) or (d.port if d is not None else 29500)
    world = workers * per
    rank, env_world = _int(env, ENV_RANK), _int(env, ENV_WORLD_SIZE)
    if rank is not None and env_world is not None and _int(env, ENV_LOCAL_RANK) is not None:
        # torchrun or our launcher: this process is one rank
        if env_world != world:
            raise SpecError(
                f"spec.distributed: the world has {world} ranks ({workers} workers × {per}), "
                f"the environment says WORLD_SIZE={env_world}"
            )
        if not 0 <= rank < world:
            raise SpecError(f"environment RANK={rank}: must be in [0, {world})")
        local = _int(env, ENV_LOCAL_RANK) or 0
        local_world = _int(env, ENV_LOCAL_WORLD_SIZE) or per
        return RankInfo(
            world_size=world,
            workers=workers,
            ranks_per_worker=per,
            node_rank=rank // per,
            local_world=local_world,
            master_addr=env.get(ENV_MASTER_ADDR) or LOCAL_MASTER,
            master_port=port,
            timeout_s=timeout,
            rank=rank,
            local_rank=local,
        )
    node = _int(env, ENV_NODE_RANK)
    if node is None:
        # a local run: this launcher runs the whole world
        return RankInfo(world, workers, per, 0, world, LOCAL_MASTER, port, timeout)
    if not 0 <= node < workers:
        raise SpecError(
            f"environment {ENV_NODE_RANK}={node}: must be in [0, {workers}) "
            "(spec.distributed.workers)"
        )
    if env_world is not None and env_world != world:
        raise SpecError(
            f"spec.distributed: the world has {world} ranks ({workers} workers × {per}), "
            f"the environment says WORLD_SIZE={env_world}"
        )
    addr = env.get(ENV_MASTER_ADDR) or LOCAL_MASTER
    return RankInfo(world, workers, per, node, per, addr, port, timeout)
