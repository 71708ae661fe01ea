"""The Job of a card run carries the backend's node facts: the family label always, the product
with ``device.product`` (a required node affinity, ANDed into the podTemplate's terms), a
partitioned resource with ``device.partition``; the precompile Job records the compile target
and compiler release; a run another controller manages is not ours."""

from __future__ import annotations

from typing import Any

from npu_lora.api import backends as registry
from npu_lora.api.v1alpha1 import MANAGED_BY
from npu_lora_operator import builders as b
from npu_lora_operator import handlers, precompile
from npu_lora_operator.settings import OperatorConfig

CFG = OperatorConfig(worker_image="reg/worker:1", worker_command=("npu-lora",))
FURIOSA = registry.entry("furiosa")
NODE = FURIOSA.node
assert NODE is not None
FAMILY = {"key": NODE.family_label, "operator": "In", "values": [NODE.family]}


def run(**spec: Any) -> b.Run:
    base: dict[str, Any] = {"model": {"preset": "tiny-qwen3-moe"}, "data": {"path": "x.tsv"}}
    base.update(spec)
    return b.Run.from_body(
        {
            "apiVersion": "npu-lora.io/v1alpha1",
            "kind": "MoEFinetune",
            "metadata": {"name": "r1", "namespace": "team", "uid": "uid-1"},
            "spec": base,
        }
    )


def pod(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def required_terms(job: dict[str, Any]) -> list[dict[str, Any]]:
    aff = pod(job)["affinity"]["nodeAffinity"]
    return aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def test_a_card_run_requires_the_family_and_its_product() -> None:
    job = b.build_job(run(device={"backend": "furiosa", "cards": 2}), CFG)
    assert required_terms(job) == [{"matchExpressions": [FAMILY]}]
    job = b.build_job(run(device={"backend": "auto", "cards": 1, "product": "rngd-max"}), CFG)
    assert required_terms(job) == [
        {
            "matchExpressions": [
                FAMILY,
                {"key": NODE.product_label, "operator": "In", "values": ["rngd-max"]},
            ]
        }
    ]


def test_a_run_without_cards_has_no_node_requirement() -> None:
    job = b.build_job(run(device={"backend": "cpu", "cards": 0}), CFG)
    assert "affinity" not in pod(job)


def test_the_podtemplate_affinity_keeps_its_terms_and_each_gets_the_requirements() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    host = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
    anti = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [host]}]
            }
        },
        **anti,
    }
    r = run(device={"backend": "furiosa", "product": "rngd"}, podTemplate={"affinity": affinity})
    job = b.build_job(r, CFG)
    product = {"key": NODE.product_label, "operator": "In", "values": ["rngd"]}
    assert required_terms(job) == [
        {"matchExpressions": [zone, FAMILY, product]},
        {"matchExpressions": [host, FAMILY, product]},
    ]
    assert pod(job)["affinity"]["podAntiAffinity"] == anti["podAntiAffinity"]
    # the spec's own object is not changed
    assert r.spec.pod_template.affinity == affinity


def test_a_partition_is_requested_instead_of_whole_cards() -> None:
    job = b.build_job(
        run(device={"backend": "furiosa", "cards": 2, "partition": "4core.24gb"}), CFG
    )
    res = pod(job)["containers"][0]["resources"]
    want = FURIOSA.partition_resource("4core.24gb")
    assert res["requests"][want] == "2" and res["limits"][want] == "2"
    assert FURIOSA.resource not in res["requests"] and FURIOSA.resource not in res["limits"]


def test_the_precompile_job_records_target_and_compiler() -> None:
    r = run(
        device={
            "backend": "furiosa",
            "product": "rngd-max",
            "compileCache": {"claimName": "cache"},
        }
    )
    job = precompile.build_precompile_job(r, CFG, 3)
    ann = job["metadata"]["annotations"]
    assert ann[precompile.TARGET_ANNOTATION] == f"{NODE.family}/rngd-max"
    assert ann[precompile.COMPILER_ANNOTATION].startswith("furiosa-torch==")
    r = run(device={"backend": "furiosa", "compileCache": {"claimName": "cache"}})
    ann = precompile.build_precompile_job(r, CFG, 3)["metadata"]["annotations"]
    assert ann[precompile.TARGET_ANNOTATION] == f"{NODE.family}/any"


def test_only_runs_managed_by_this_operator_are_ours() -> None:
    body = {"spec": {"managedBy": MANAGED_BY}}
    assert handlers.is_managed(body) and handlers.is_managed({"spec": {}})
    assert not handlers.is_managed({"spec": {"managedBy": "kueue.x-k8s.io/multikueue"}})
    assert handlers.managed_here(body=body) is True


def test_memory_auto_leaves_the_experts_on_hugepages_out() -> None:
    """``memory: auto`` for Qwen3-30B-A3B in bf16: 72Gi; with hugepages-2Mi holding all 48
    layers' experts (58Gi) the memory limit keeps only the rest (LoRA state, activations,
    data, runtime) × 1.25; the pod gets the hugepages."""
    from npu_lora_operator.policy import PodPolicy
    from npu_lora_operator.policy.resources import auto_memory

    base = {"model": {"preset": "qwen3-30b-a3b"}, "moe": {"hostDtype": "bfloat16"}}
    plain, _ = auto_memory(run(**base).spec, PodPolicy())
    hp = run(**base, resources={"limits": {"hugepages-2Mi": "58Gi"}})
    with_hp, how = auto_memory(hp.spec, PodPolicy())
    assert plain == "72Gi" and "hugepages-2Mi" in how
    assert 2 < int(with_hp[:-2]) <= 5, with_hp  # + the load transient (one expert tensor)
    res = pod(b.build_job(hp, CFG))["containers"][0]["resources"]
    assert res["limits"]["hugepages-2Mi"] == "58Gi" and res["limits"]["memory"] == with_hp
