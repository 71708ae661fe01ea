"""Issue 28's last policy gaps: ``imagePullSecrets`` only from ``allowedImagePullSecrets``, and
emptyDir volumes bounded (``sizeLimit`` required and capped; ``medium: Memory`` counted against
the worker's memory). Hostile cases of our own, each refused with the field named."""

from __future__ import annotations

from typing import Any

import pytest
from npu_lora_operator import builders as b
from npu_lora_operator import policy as pol
from npu_lora_operator.settings import OperatorConfig
from policy_runs import run

WORKER = "reg/npu-lora-worker:1"
FAST = pol.PodPolicy(default_resources=())


def fields(pt: dict[str, Any], policy: pol.PodPolicy = FAST, **spec: Any) -> list[str]:
    return [v.field for v in pol.check_spec(run(podTemplate=pt, **spec).spec, policy, WORKER)]


def empty_dir(**src: Any) -> dict[str, Any]:
    return {"volumes": [{"name": "s", "emptyDir": src}]}


# --- imagePullSecrets ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["regcred", "default-token-abc", "kube-root-ca.crt", "admin"])
def test_pull_secrets_are_refused_by_default(name: str) -> None:
    pt = {"imagePullSecrets": [{"name": name}]}
    assert fields(pt) == ["spec.podTemplate.imagePullSecrets[0].name"]
    text = pol.describe(pol.check_spec(run(podTemplate=pt).spec, FAST, WORKER))
    assert "no image pull Secret is allowed" in text and "allowedImagePullSecrets" in text


def test_pull_secrets_from_the_allow_list_pass_and_reach_the_pod() -> None:
    policy = pol.PodPolicy(default_resources=(), allowed_image_pull_secrets=("regcred", "team-*"))
    pt = {"imagePullSecrets": [{"name": "regcred"}, {"name": "team-a"}]}
    assert fields(pt, policy) == []
    job = b.build_job(run(podTemplate=pt), OperatorConfig(worker_image=WORKER, policy=policy))
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == pt["imagePullSecrets"]
    # the glob matches names only: a name it does not cover is still refused
    assert fields({"imagePullSecrets": [{"name": "teamx"}]}, policy) == [
        "spec.podTemplate.imagePullSecrets[0].name"
    ]


@pytest.mark.parametrize(
    "secrets, field",
    [
        ([{"name": "../regcred"}], "spec.podTemplate.imagePullSecrets[0].name"),
        ([{"name": "RegCred"}], "spec.podTemplate.imagePullSecrets[0].name"),
        ([{"name": "regcred", "namespace": "kube-system"}], "spec.podTemplate.imagePullSecrets[0]"),
        ([{"name": 7}], "spec.podTemplate.imagePullSecrets[0]"),
        (["regcred"], "spec.podTemplate.imagePullSecrets[0]"),
        ([{"name": "regcred"}] * 9, "spec.podTemplate.imagePullSecrets"),
    ],
)
def test_hostile_pull_secret_entries_are_refused(secrets: list, field: str) -> None:
    policy = pol.PodPolicy(default_resources=(), allowed_image_pull_secrets=("regcred", "*"))
    got = pol.check_pod_template({"imagePullSecrets": secrets}, policy)
    assert [v.field for v in got] == [field]


# --- emptyDir -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src",
    [
        {},  # unbounded: fills the node's disk
        {"sizeLimit": ""},
        {"sizeLimit": "0"},
        {"sizeLimit": "-1Gi"},
        {"sizeLimit": "lots"},
        {"sizeLimit": "1Pi"},  # outside the forms the policy reads
        {"sizeLimit": "1Gi "},
        {"sizeLimit": "1e9"},
        {"sizeLimit": True},
        {"sizeLimit": None},
        {"medium": "Memory"},  # an unbounded tmpfs: the node's RAM
    ],
)
def test_empty_dir_needs_a_size_limit(src: dict) -> None:
    assert fields(empty_dir(**src)) == ["spec.podTemplate.volumes[0].emptyDir.sizeLimit"]


@pytest.mark.parametrize("size", ["1Gi", "512Mi", "1.5Gi", "32Gi", 1073741824, "2G"])
def test_empty_dir_within_the_cap_passes(size: Any) -> None:
    assert fields(empty_dir(sizeLimit=size)) == []


@pytest.mark.parametrize(
    "vols",
    [
        [{"name": "s", "emptyDir": {"sizeLimit": "33Gi"}}],
        [{"name": "s", "emptyDir": {"sizeLimit": "1Ti"}}],
        # split over several volumes: the cap is the pod's total
        [{"name": f"s{i}", "emptyDir": {"sizeLimit": "9Gi"}} for i in range(4)],
        [{"name": "m", "emptyDir": {"medium": "Memory", "sizeLimit": "9Gi"}}],
        [{"name": f"m{i}", "emptyDir": {"medium": "Memory", "sizeLimit": "5Gi"}} for i in range(2)],
    ],
)
def test_empty_dir_totals_over_the_caps_are_refused(vols: list) -> None:
    assert fields({"volumes": vols}) == ["spec.podTemplate.volumes"]


def test_disk_and_memory_caps_are_separate_and_set_by_the_policy() -> None:
    vols = [
        {"name": "d", "emptyDir": {"sizeLimit": "30Gi"}},
        {"name": "m", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
    ]
    assert fields({"volumes": vols}) == []
    small = pol.PodPolicy.from_mapping(
        {"maxEmptyDirSize": "10Gi", "maxMemoryEmptyDirSize": "1Gi", "defaultResources": {}}
    )
    assert fields({"volumes": vols}, small) == ["spec.podTemplate.volumes"] * 2
    for bad in ("lots", "-1Gi", "", 5):
        with pytest.raises(ValueError, match="maxEmptyDirSize"):
            pol.PodPolicy.from_mapping({"maxEmptyDirSize": bad})


@pytest.mark.parametrize("medium", ["memory", "HugePages", "HugePages-2Mi", "Disk"])
def test_other_media_are_refused(medium: str) -> None:
    got = fields(empty_dir(medium=medium, sizeLimit="1Gi"))
    assert got == ["spec.podTemplate.volumes[0].emptyDir.medium"]


def test_memory_volumes_are_added_to_the_auto_memory() -> None:
    policy = pol.PodPolicy()
    plain, _ = pol.auto_memory(run().spec, policy)
    pt = {"volumes": [{"name": "m", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}]}
    with_tmpfs, how = pol.auto_memory(run(podTemplate=pt).spec, policy)
    assert int(with_tmpfs[:-2]) == int(plain[:-2]) + 4, (plain, with_tmpfs)
    assert "medium Memory" in how
    # a model the operator cannot size: memoryWhenUnknown + the tmpfs
    by_path = {"path": "/mnt/model/x", "volume": {"claimName": "models"}}
    unknown, _ = pol.auto_memory(run(model=by_path, podTemplate=pt).spec, policy)
    assert unknown == "20Gi"
    job = b.build_job(run(podTemplate=pt), OperatorConfig(worker_image=WORKER, policy=policy))
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["memory"] == with_tmpfs


def test_memory_volumes_may_not_take_an_explicit_limit() -> None:
    pt = {"volumes": [{"name": "m", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}]}
    assert fields(pt, resources={"limits": {"memory": "4Gi"}}) == ["spec.podTemplate.volumes"]
    assert fields(pt, resources={"limits": {"memory": "3Gi"}}) == ["spec.podTemplate.volumes"]
    assert fields(pt, resources={"limits": {"memory": "6Gi"}}) == []
    # a request alone leaves the limit to the policy's auto memory (tmpfs added there)
    assert fields(pt, resources={"requests": {"memory": "1Gi"}}) == []


def test_memory_volumes_may_not_take_the_policys_default_limit() -> None:
    pt = {"volumes": [{"name": "m", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]}
    fixed = pol.PodPolicy.from_mapping({"defaultResources": {"limits": {"memory": "8Gi"}}})
    assert fields(pt, fixed) == ["spec.podTemplate.volumes"]
    roomy = pol.PodPolicy.from_mapping({"defaultResources": {"limits": {"memory": "24Gi"}}})
    assert fields(pt, roomy) == []
    # the spec's own limit overrides the default (and is what must leave room)
    assert fields(pt, fixed, resources={"limits": {"memory": "12Gi"}}) == []
