"""The admission policy (npu_lora_operator.policy): pure checks naming the field, defaults."""

from __future__ import annotations

import pytest
from npu_lora_operator import builders as b
from npu_lora_operator import policy as pol
from npu_lora_operator.settings import OperatorConfig
from policy_runs import run

WORKER = "reg/npu-lora-worker:1"
CFG = OperatorConfig(worker_image=WORKER)


def violations(r: b.Run, policy: pol.PodPolicy | None = None) -> list[tuple[str, str]]:
    p = policy or pol.PodPolicy()
    children = b.build_children(r, OperatorConfig(worker_image=WORKER, policy=p))
    return [(v.field, v.message) for v in pol.check(r.spec, children, p, WORKER)]


def test_default_policy_admits_a_plain_run() -> None:
    assert violations(run()) == []
    assert violations(run(image=WORKER)) == []  # the operator's own worker image, spelt out
    assert violations(run(output={"volume": {"claimName": "runs"}})) == []


def test_image_outside_the_allowed_list_is_named() -> None:
    assert violations(run(image="evil/miner:latest")) == [
        ("spec.image", f'image "evil/miner:latest" is not allowed (allowed: {WORKER})')
    ]
    allow = pol.PodPolicy(allowed_images=("reg/*",))
    assert violations(run(image="reg/other:2"), allow) == []
    assert [f for f, _ in violations(run(image="reg2/x:1"), allow)] == ["spec.image"]
    assert violations(run(image="anything:1"), pol.PodPolicy(allowed_images=("*",))) == []


def test_service_account_name_refused_unless_listed() -> None:
    r = run(podTemplate={"serviceAccountName": "cluster-admin-sa"})
    ((field, msg),) = violations(r)
    assert field == "spec.podTemplate.serviceAccountName"
    assert '"cluster-admin-sa" is not allowed' in msg and "no serviceAccountName" in msg
    assert violations(r, pol.PodPolicy(allowed_service_accounts=("cluster-admin-sa",))) == []
    assert violations(r, pol.PodPolicy(allowed_service_accounts=("trainer-*",))) != []


def test_every_host_path_is_named() -> None:
    r = run(
        model={"preset": "tiny-qwen3-moe"},
        data={"path": "x.tsv", "volume": {"hostPath": "/srv/data"}},
        output={"volume": {"hostPath": "/"}},
        device={"backend": "cpu", "compileCache": {"hostPath": "/var/cache/furiosa"}},
        podTemplate={
            "volumes": [
                {"name": "ok", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "root", "hostPath": {"path": "/etc"}},
            ],
            "volumeMounts": [{"name": "root", "mountPath": "/data/host-etc"}],
        },
    )
    assert [f for f, _ in violations(r)] == [
        "spec.data.volume.hostPath",
        "spec.output.volume.hostPath",
        "spec.device.compileCache.hostPath",
        "spec.podTemplate.volumes[1].hostPath",
    ]
    assert violations(r)[1][1] == 'hostPath "/" is not allowed (no hostPath volume is allowed)'
    # prefixes are whole path components; `..` cannot climb out
    some = pol.PodPolicy(allowed_host_paths=("/srv",))
    assert [f for f, _ in violations(r, some)] == [
        "spec.output.volume.hostPath",
        "spec.device.compileCache.hostPath",
        "spec.podTemplate.volumes[1].hostPath",
    ]
    assert violations(run(output={"volume": {"hostPath": "/srv/../etc"}}), some) != []
    assert violations(run(output={"volume": {"hostPath": "/srvx"}}), some) != []
    assert violations(run(output={"volume": {"hostPath": "/srv/runs"}}), some) == []
    assert violations(r, pol.PodPolicy(allowed_host_paths=("/",))) == []


def test_privileged_settings_in_the_built_pod() -> None:
    pod = {
        "hostNetwork": True,
        "hostPID": True,
        "securityContext": {"runAsUser": 0},
        "containers": [
            {
                "name": "w",
                "securityContext": {
                    "privileged": True,
                    "allowPrivilegeEscalation": True,
                    "capabilities": {"add": ["SYS_ADMIN"]},
                    "runAsNonRoot": False,
                },
            }
        ],
    }
    fields = [v.field for v in pol.check_pod_spec(pod, "pod")]
    assert fields == [
        "pod.hostNetwork",
        "pod.hostPID",
        "pod.securityContext.runAsUser",
        "pod.containers[0].securityContext.privileged",
        "pod.containers[0].securityContext.allowPrivilegeEscalation",
        "pod.containers[0].securityContext.capabilities.add",
        "pod.containers[0].securityContext.runAsNonRoot",
    ]
    # the operator's own pod is not privileged; a root worker uid configured by the admin is
    assert violations(run()) == []
    root = OperatorConfig(worker_image=WORKER, run_as_user=0)
    r = run()
    found = pol.check(r.spec, b.build_children(r, root), pol.PodPolicy(), WORKER)
    assert [v.field for v in found] == [
        "Job r1: spec.template.spec.securityContext.runAsUser",
        "Job r1: spec.template.spec.containers[0].securityContext.runAsUser",
    ]
    allow = pol.PodPolicy(allow_privileged=True)
    assert pol.check(r.spec, b.build_children(r, root), allow, WORKER) == []


def test_describe_names_every_field_and_the_admin() -> None:
    msg = pol.describe(
        [pol.Violation("spec.image", "no"), pol.Violation("spec.output.volume.hostPath", "no")]
    )
    assert msg.startswith("refused by the operator's admission policy: spec.image: no; ")
    assert "spec.output.volume.hostPath: no" in msg and "chart's `policy` values" in msg


def test_policy_from_chart_values() -> None:
    p = pol.PodPolicy.from_mapping(
        {
            "allowedImages": ["reg/*"],
            "allowedServiceAccountNames": ["trainer"],
            "allowedHostPaths": ["/srv"],
            "allowPrivileged": False,
            "defaultResources": {"requests": {"cpu": "2", "memory": "auto"}, "limits": {}},
            "memoryWhenUnknown": "32Gi",
        }
    )
    assert p.allowed_images == ("reg/*",) and p.allowed_host_paths == ("/srv",)
    assert p.defaults("requests") == {"cpu": "2", "memory": "auto"} and p.defaults("limits") == {}
    assert pol.PodPolicy.from_json("") == pol.PodPolicy()
    cfg = OperatorConfig.from_env({"NPU_LORA_POLICY": '{"allowedImages": ["x/*"]}'})
    assert cfg.policy.allowed_images == ("x/*",)
    for bad, key in (
        ({"allowedImage": []}, "policy.allowedImage: unknown key"),
        ({"allowedHostPaths": ["srv"]}, "policy.allowedHostPaths: expected absolute paths"),
        ({"allowPrivileged": "no"}, "policy.allowPrivileged: expected true or false"),
        ({"memoryWhenUnknown": "lots"}, "policy.memoryWhenUnknown: expected a memory quantity"),
    ):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            pol.PodPolicy.from_mapping(bad)
    with pytest.raises(ValueError, match="NPU_LORA_POLICY: not JSON"):
        pol.PodPolicy.from_json("{")


def test_default_resources_fill_only_what_the_spec_leaves_unset() -> None:
    p = pol.PodPolicy()
    spec = run().spec
    assert pol.default_resources(spec, {}, p) == {
        "requests": {"cpu": "1", "memory": "3Gi"},
        "limits": {"memory": "3Gi"},
    }
    # a limit without a request: Kubernetes defaults the request to the limit
    assert pol.default_resources(spec, {"limits": {"memory": "8Gi"}}, p) == {
        "requests": {"cpu": "1"},
        "limits": {"memory": "8Gi"},
    }
    # a request above the default limit: the limit is raised to the request
    assert pol.default_resources(spec, {"requests": {"memory": "64Gi", "cpu": "8"}}, p) == {
        "requests": {"memory": "64Gi", "cpu": "8"},
        "limits": {"memory": "64Gi"},
    }
    # builder: the spec's own values win, the rest defaulted
    r = run(resources={"requests": {"cpu": 4}})
    c = b.build_job(r, CFG)["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["requests"] == {"cpu": "4", "memory": "3Gi", "furiosa.ai/rngd": "1"}


def test_auto_memory_from_the_model_size() -> None:
    p = pol.PodPolicy()
    big = run(
        model={"preset": "qwen3-30b-a3b"},
        moe={"hostDtype": "bfloat16"},
        training={"seqLen": 2048, "batchSize": 1, "steps": 10},
    ).spec
    qty, how = pol.auto_memory(big, p)
    # the preflight estimate (54 GiB of bf16 experts + activations) + 25 % + 2 GiB
    assert how.startswith("estimated from the model") and 60 <= int(qty[:-2]) <= 90, (qty, how)
    assert pol.auto_memory(run(training={"seqLen": 32}).spec, p)[0] == "3Gi"
    on_volume = run(model={"path": "qwen", "volume": {"claimName": "models"}}).spec
    assert pol.auto_memory(on_volume, p) == (
        "16Gi",
        "policy.memoryWhenUnknown (model size unknown)",
    )
