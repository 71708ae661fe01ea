"""Data-parallel training on ``torch.distributed`` (``spec.distributed``).

Topology: ``workers`` pods (one Indexed Job in a cluster; node rank = ``JOB_COMPLETION_INDEX``)
× ``ranksPerWorker`` processes each (one per card), ``world = workers × ranksPerWorker``;
global rank = ``node_rank × ranksPerWorker + local_rank``. A world of one is today's run,
unchanged (no process group, no extra record keys).

- :mod:`.env`: who am I (rank, world, master address) from the spec and the environment
  (``JOB_COMPLETION_INDEX``, ``MASTER_ADDR``, ``MASTER_PORT``; or torchrun's ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``: one process a rank, no spawning);
- :mod:`.launch`: ``npu-lora run`` spawns the local ranks (``torch.multiprocessing``, spawn),
  shares the frozen host expert weights between them (one copy a pod) and returns the first
  failing rank's exit code after stopping the others;
- :mod:`.group`: the gloo process group (rendezvous timeout → exit code 4) and
  :class:`~npu_lora.distributed.group.DataParallel`, the loop's per-step collectives.

Collectives: gloo on the host for everything (the LoRA gradients are host-sized and small; the
routing counts live on the host). With a cuda device the LoRA gradients could be reduced with
nccl instead; furiosa-torch 2026.4 ships no collective backend for RNGD that we know of, so RNGD
runs reduce on the host with gloo (the adapter weights are copied to the host for it).
"""

from npu_lora.distributed.env import RankInfo, rank_info

__all__ = ["RankInfo", "rank_info"]
