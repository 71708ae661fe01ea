"""spec.distributed in the operator: the Indexed Job and the headless Service as dicts, the
single-rank Job unchanged, the rendezvous timeout as a condition reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from npu_lora.api.v1alpha1 import EXIT_RENDEZVOUS_TIMEOUT, MoEFinetuneSpec
from npu_lora_operator import builders as b
from npu_lora_operator import status as st
from test_builders import CFG, LABELS, OWNER, run
from test_status import NOW, conds, job, mft, pod


def _memory(job_: dict[str, Any]) -> str:
    return job_["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]


def _gi(q: str) -> int:
    assert q.endswith("Gi"), q
    return int(q[:-2])


def _same_memory(job_: dict[str, Any], like: dict[str, Any]) -> None:
    """Several ranks in one pod are several processes: ``memory: auto`` counts each one's own
    runtime (api.memory), so the pod asks for more than the one-rank pod; set it equal so the
    rest can be compared key by key."""
    assert _gi(_memory(job_)) > _gi(_memory(like)), (_memory(job_), _memory(like))
    res = job_["spec"]["template"]["spec"]["containers"][0]["resources"]
    want = like["spec"]["template"]["spec"]["containers"][0]["resources"]
    res["limits"]["memory"] = want["limits"]["memory"]
    if "requests" in res:
        res["requests"]["memory"] = want["requests"]["memory"]


def test_one_rank_keeps_the_job_byte_for_byte() -> None:
    plain = b.build_children(run(), CFG)
    one = b.build_children(run(distributed={"workers": 1, "ranksPerWorker": 1}), CFG)
    assert [c["kind"] for c in one] == [c["kind"] for c in plain]
    assert one[-1] == plain[-1]  # the Job
    assert "distributed" not in b.worker_config(run())["spec"]


def test_several_ranks_in_one_pod_plain_job_rendezvous_code_fails_it() -> None:
    job_ = b.build_job(run(device={"cards": 4}, distributed={"ranksPerWorker": 4}), CFG)
    plain = b.build_job(run(device={"cards": 4}), CFG)
    assert job_["spec"]["parallelism"] == job_["spec"]["completions"] == 1
    assert "completionMode" not in job_["spec"]
    codes = job_["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"]
    assert codes == [2, 3, EXIT_RENDEZVOUS_TIMEOUT]
    a, c = copy.deepcopy(job_), copy.deepcopy(plain)
    for j in (a, c):
        j["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] = []
    _same_memory(a, c)
    assert a == c  # nothing else differs
    cm = b.build_configmap(run(device={"cards": 4}, distributed={"ranksPerWorker": 4}))
    assert "ranksPerWorker: 4" in cm["data"]["config.yaml"]


def test_multi_worker_indexed_job_and_headless_service() -> None:
    r = run(
        device={"backend": "furiosa", "cards": 8},
        distributed={"workers": 16, "port": 29400},
        queueName="npu-queue",
        backoffLimit=1,
    )
    children = b.build_children(r, CFG)
    assert [c["kind"] for c in children] == [
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Service",
        "Job",
    ]
    svc = children[-2]
    assert svc == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "r1-dp",
            "namespace": "team",
            "labels": LABELS,
            "ownerReferences": [OWNER],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"npu-lora.io/run": "r1"},
            "ports": [
                {"name": "rendezvous", "port": 29400, "targetPort": 29400, "protocol": "TCP"}
            ],
        },
    }
    job_ = children[-1]
    plain = b.build_job(
        run(device={"backend": "furiosa", "cards": 8}, queueName="npu-queue", backoffLimit=1), CFG
    )
    # what the distributed Job adds to the single-pod one, key by key
    spec, pspec = job_["spec"], job_["spec"]["template"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 16, 16)
    assert spec["backoffLimit"] == 16  # backoffLimit 1 per worker: one round of failures
    assert spec["suspend"] is True and job_["metadata"]["labels"][b.QUEUE_LABEL] == "npu-queue"
    assert pspec["subdomain"] == "r1-dp"
    env = pspec["containers"][0]["env"]
    assert env[-3:] == [
        {"name": "MASTER_ADDR", "value": "r1-0.r1-dp"},
        {"name": "MASTER_PORT", "value": "29400"},
        {"name": "WORLD_SIZE", "value": "128"},
    ]
    assert pspec["containers"][0]["resources"]["limits"]["furiosa.ai/rngd"] == "8"
    rest, base = copy.deepcopy(job_), copy.deepcopy(plain)
    for k in ("completionMode", "completions", "parallelism", "backoffLimit", "podFailurePolicy"):
        rest["spec"].pop(k, None)
        base["spec"].pop(k, None)
    del rest["spec"]["template"]["spec"]["subdomain"]
    rest["spec"]["template"]["spec"]["containers"][0]["env"] = env[:-3]
    _same_memory(rest, base)
    assert rest == base


def test_service_name_is_a_dns_1035_label() -> None:
    assert b.service_name("9run") == "r-9run-dp"
    long = "a" * 63
    assert len(b.service_name(long)) <= 63 and b.service_name(long).endswith("-dp")


@pytest.mark.parametrize(
    ("distributed", "device", "message"),
    [
        ({"ranksPerWorker": 4}, {"cards": 2}, "distributed.ranksPerWorker (4) must be at most"),
        ({"workers": 0}, {}, "distributed.workers"),
        ({"rendezvousTimeoutSeconds": 1}, {}, "distributed.rendezvousTimeoutSeconds"),
    ],
)
def test_invalid_distributed_is_refused_naming_the_field(
    distributed: dict[str, Any], device: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MoEFinetuneSpec.model_validate(
            {
                "model": {"preset": "tiny-qwen3-moe"},
                "data": {"path": "x"},
                "device": device,
                "distributed": distributed,
            }
        )


def test_cpu_without_cards_may_run_several_ranks() -> None:
    s = MoEFinetuneSpec.model_validate(
        {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "x"},
            "device": {"backend": "cpu", "cards": 0},
            "distributed": {"workers": 2, "ranksPerWorker": 3},
        }
    )
    assert s.distributed is not None and s.distributed.world_size(s.device.cards) == 6
    d = MoEFinetuneSpec.model_validate(
        {
            "model": {"preset": "tiny-qwen3-moe"},
            "data": {"path": "x"},
            "device": {"cards": 4},
            "distributed": {},
        }
    ).distributed
    assert d is not None and d.ranks(4) == 4  # default: one rank per card


def test_rendezvous_timeout_is_its_own_condition_reason() -> None:
    p = pod(
        name="r1-0-abc",
        phase="Failed",
        state={
            "terminated": {
                "exitCode": EXIT_RENDEZVOUS_TIMEOUT,
                "reason": "Error",
                "message": "exit 4: rank 0: the 2 ranks did not all join the process group",
            }
        },
    )
    j = job(("FailureTarget", "PodFailurePolicy"), ("Failed", "PodFailurePolicy"), failed=1)
    s = st.compute_status(mft(), j, [p], now=NOW)
    assert s["phase"] == "Failed"
    assert conds(s)["Failed"] == ("True", "RendezvousTimeout")
    assert "code 4" in s["message"] and "did not all join" in s["message"]
    assert "not every rank joined" in s["message"]
