"""Who a process is in the data-parallel world (pure: spec + environment), and the status
subtree rank 0 reports."""

from __future__ import annotations

from typing import Any

import pytest
from npu_lora.api.load import SpecError
from npu_lora.api.v1alpha1 import MoEFinetuneSpec, MoEFinetuneStatus
from npu_lora.distributed import rank_info
from npu_lora.report.status import distributed_status


def spec(cards: int = 0, **distributed: Any) -> MoEFinetuneSpec:
    return MoEFinetuneSpec.model_validate(
        {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "x"},
            "device": {"backend": "cpu", "cards": cards},
            **({"distributed": distributed} if distributed else {}),
        }
    )


def test_no_distributed_is_one_rank() -> None:
    info = rank_info(spec(), {})
    assert not info.distributed and info.world_size == 1 and info.is_rank0


def test_local_run_spawns_the_whole_world() -> None:
    info = rank_info(spec(workers=2, ranksPerWorker=3, port=29600), {})
    assert (info.rank, info.world_size, info.local_world, info.node_rank) == (None, 6, 6, 0)
    r5 = info.for_local(5)
    assert r5.rank == 5 and r5.child_env() == {
        "RANK": "5",
        "WORLD_SIZE": "6",
        "LOCAL_RANK": "5",
        "LOCAL_WORLD_SIZE": "6",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29600",
    }


def test_indexed_job_pod_is_a_node_of_the_world() -> None:
    env = {"JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "run-0.run-dp", "WORLD_SIZE": "16"}
    info = rank_info(spec(cards=8, workers=2), env)  # ranksPerWorker defaults to the cards
    assert (info.world_size, info.node_rank, info.local_world, info.first_rank()) == (16, 1, 8, 8)
    assert info.for_local(3).rank == 11 and info.master_addr == "run-0.run-dp"
    with pytest.raises(SpecError, match="JOB_COMPLETION_INDEX=2"):
        rank_info(spec(workers=2), {"JOB_COMPLETION_INDEX": "2"})
    with pytest.raises(SpecError, match="WORLD_SIZE=3"):
        rank_info(spec(workers=2), {"JOB_COMPLETION_INDEX": "0", "WORLD_SIZE": "3"})


def test_torchrun_environment_is_one_rank() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "7",
    }
    info = rank_info(spec(workers=2, ranksPerWorker=2), env)
    assert (info.rank, info.local_rank, info.node_rank, info.master_port) == (3, 1, 1, 7)
    with pytest.raises(SpecError, match="RANK=4"):
        rank_info(spec(workers=2, ranksPerWorker=2), {**env, "RANK": "4"})
    with pytest.raises(SpecError, match="not an integer"):
        rank_info(spec(workers=2, ranksPerWorker=2), {**env, "RANK": "x"})


def test_distributed_status_of_a_record() -> None:
    info = rank_info(spec(workers=2, ranksPerWorker=1), {})
    rec = {
        "step": 7,
        "world_size": 2,
        "allreduce_s": 0.0123456,
        "allreduce_bytes": 28672,
        "rank_compute_s": [0.1, 0.1254321],
        "slowest_rank": 1,
        "skew_s": 0.0254321,
    }
    got = distributed_status(rec, info)
    MoEFinetuneStatus.model_validate({"distributed": got})  # the API's status model accepts it
    assert got == {
        "worldSize": 2,
        "workers": 2,
        "ranksPerWorker": 1,
        "step": 7,
        "rankComputeSeconds": [0.1, 0.1254],
        "slowestRank": 1,
        "skewSeconds": 0.02543,
        "allreduceSeconds": 0.01235,
        "allreduceBytes": 28672,
    }


def test_each_rank_drives_the_card_of_its_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from npu_lora import backends

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert backends._local_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert backends._local_rank() == 3
    assert backends.get_backend("cpu").name == "cpu"  # the host stand-in has no card index
