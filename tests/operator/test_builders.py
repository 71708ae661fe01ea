"""The pure builders: MoEFinetune (typed ``Run``) → ConfigMap, RBAC, Job dicts."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from npu_lora.api.load import load_manifest
from npu_lora_operator import builders as b
from npu_lora_operator.settings import OperatorConfig, parse_command

CFG = OperatorConfig(worker_image="reg/worker:1", worker_command=("npu-lora",))
OWNER = {
    "apiVersion": "npu-lora.io/v1alpha1",
    "kind": "MoEFinetune",
    "name": "r1",
    "uid": "uid-1",
    "controller": True,
    "blockOwnerDeletion": True,
}
LABELS = {
    "app.kubernetes.io/name": "npu-lora",
    "app.kubernetes.io/instance": "r1",
    "app.kubernetes.io/component": "worker",
    "app.kubernetes.io/part-of": "npu-lora",
    "app.kubernetes.io/managed-by": "npu-lora-operator",
    "npu-lora.io/run": "r1",
}


def run(*, name: str = "r1", **spec: Any) -> b.Run:
    base: dict[str, Any] = {
        "model": {"preset": "tiny-qwen3-moe"},
        "data": {"path": "example:nsmc-mini"},
    }
    base.update(spec)
    return b.Run.from_body(
        {
            "apiVersion": "npu-lora.io/v1alpha1",
            "kind": "MoEFinetune",
            "metadata": {"name": name, "namespace": "team", "uid": "uid-1", "generation": 1},
            "spec": base,
        }
    )


def test_full_job() -> None:
    body = run(
        model={"path": "qwen3", "volume": {"claimName": "models"}},
        data={"path": "nsmc/train.tsv", "volume": {"hostPath": "/data", "subPath": "x"}},
        output={"path": "exp/1", "volume": {"claimName": "runs"}},
        device={"backend": "furiosa", "cards": 2, "compileCache": {"claimName": "cache"}},
        resources={"requests": {"cpu": 8, "memory": "64Gi"}, "limits": {"memory": "96Gi"}},
        backoffLimit=3,
        activeDeadlineSeconds=3600,
        ttlSecondsAfterFinished=600,
        queueName="npu-queue",
        suspend=True,
        podTemplate={
            "nodeSelector": {"furiosa.ai/model": "rngd"},
            "tolerations": [{"key": "npu", "operator": "Exists"}],
            "priorityClassName": "batch",
            "imagePullSecrets": [{"name": "regcred"}],
            "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
            "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
        },
    )
    job = b.build_job(body, CFG)
    expected_container = {
        "name": "worker",
        "image": "reg/worker:1",
        "imagePullPolicy": "IfNotPresent",
        "command": ["npu-lora", "run", "/etc/npu-lora/config.yaml", "--out", "/mnt/output/exp/1"],
        "env": [
            {"name": "NPU_LORA_RESOURCE_NAME", "value": "r1"},
            {"name": "NPU_LORA_RESOURCE_NAMESPACE", "value": "team"},
            {"name": "NPU_LORA_RESOURCE_UID", "value": "uid-1"},
            {"name": "HOME", "value": "/tmp"},
            {"name": "XDG_CACHE_HOME", "value": "/mnt/cache"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "NPU_LORA_TERMINATION_LOG", "value": "/dev/termination-log"},
            {"name": "NPU_LORA_DATA_ROOT", "value": "/mnt/data"},
            {"name": "NPU_LORA_COMPILE_CACHE", "value": "/mnt/cache/furiosa/npu-lora"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
        ],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/npu-lora", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "model", "mountPath": "/mnt/model", "readOnly": True},
            {"name": "data", "mountPath": "/mnt/data", "readOnly": True, "subPath": "x"},
            {"name": "output", "mountPath": "/mnt/output"},
            {"name": "compile-cache", "mountPath": "/mnt/cache/furiosa"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {
            "requests": {"cpu": "8", "memory": "64Gi", "furiosa.ai/rngd": "2"},
            "limits": {"memory": "96Gi", "furiosa.ai/rngd": "2"},
        },
    }
    expected = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "r1",
            "namespace": "team",
            "labels": {**LABELS, "kueue.x-k8s.io/queue-name": "npu-queue"},
            "annotations": {"npu-lora.io/run-name": "r1"},
            "ownerReferences": [OWNER],
        },
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 3,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "worker",
                            "operator": "In",
                            "values": [2, 3],
                        },
                    },
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    },
                ]
            },
            "suspend": True,
            "activeDeadlineSeconds": 3600,
            "ttlSecondsAfterFinished": 600,
            "template": {
                "metadata": {
                    "labels": LABELS,
                    "annotations": {
                        "kubectl.kubernetes.io/default-container": "worker",
                        "npu-lora.io/run-name": "r1",
                    },
                },
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": "r1-worker",
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "fsGroup": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [expected_container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "r1-config"}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "8Gi"}},
                        {
                            "name": "model",
                            "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
                        },
                        {"name": "data", "hostPath": {"path": "/data", "type": "Directory"}},
                        {
                            "name": "output",
                            "persistentVolumeClaim": {"claimName": "runs", "readOnly": False},
                        },
                        {
                            "name": "compile-cache",
                            "persistentVolumeClaim": {"claimName": "cache", "readOnly": False},
                        },
                        {"name": "shm", "emptyDir": {"medium": "Memory"}},
                    ],
                    "nodeSelector": {"furiosa.ai/model": "rngd"},
                    "tolerations": [{"key": "npu", "operator": "Exists"}],
                    "priorityClassName": "batch",
                    "imagePullSecrets": [{"name": "regcred"}],
                    # a card run: the backend's family label (the registry's node facts)
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "furiosa.ai/npu.family",
                                                "operator": "In",
                                                "values": ["rngd"],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                },
            },
        },
    }
    assert job == expected


def test_minimal_job_defaults() -> None:
    job = b.build_job(run(), CFG)
    spec = job["spec"]
    assert spec["backoffLimit"] == 2 and spec["suspend"] is False
    assert "activeDeadlineSeconds" not in spec and "ttlSecondsAfterFinished" not in spec
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    # backend auto, 1 card by default: one RNGD; CPU and memory from the default admission
    # policy: cpu 1, memory `auto` (the tiny model's estimate, backend auto: with the 2 GiB
    # runtime allowance of an unmeasured backend, × 1.25 -> 3Gi)
    assert c["resources"] == {
        "requests": {"cpu": "1", "memory": "3Gi", "furiosa.ai/rngd": "1"},
        "limits": {"memory": "3Gi", "furiosa.ai/rngd": "1"},
    }
    assert c["command"][-2:] == ["--out", "/mnt/output/r1"]
    # no output volume: an emptyDir keeps the run directory writable
    assert {"name": "output", "emptyDir": {}} in pod["volumes"]
    assert {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"} in c["env"]
    for key in ("nodeSelector", "tolerations", "priorityClassName"):
        assert key not in pod
    # one card of auto: only the family requirement (tests/operator/test_node_facts.py)
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert [e["key"] for e in term["matchExpressions"]] == ["furiosa.ai/npu.family"]


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ({"backend": "cpu", "cards": 1}, {}),
        ({"backend": "cuda", "cards": 2}, {"nvidia.com/gpu": 2}),
        ({"backend": "auto", "cards": 0}, {}),
        ({"backend": "auto", "cards": 4}, {"furiosa.ai/rngd": 4}),
    ],
)
def test_accelerator(device: dict[str, Any], expected: dict[str, int]) -> None:
    assert b.accelerator_resources(run(device=device)) == expected
    c = b.build_job(run(device=device), CFG)["spec"]["template"]["spec"]["containers"][0]
    res = c["resources"]
    accel = {k for part in res.values() for k in part} - {"cpu", "memory"}
    assert accel == set(expected)


def test_worker_command_and_image() -> None:
    cfg = OperatorConfig(worker_command=tuple(parse_command('["python", "-m", "npu_lora.cli"]')))
    body = run(image="mine:2", output={"path": "/abs/dir"})
    c = b.build_job(body, cfg)["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == [
        "python",
        "-m",
        "npu_lora.cli",
        "run",
        "/etc/npu-lora/config.yaml",
        "--out",
        "/mnt/output/abs/dir",
    ]
    assert c["image"] == "mine:2"
    assert parse_command("npu-lora --flag") == ["npu-lora", "--flag"]
    assert parse_command(None) == ["npu-lora"]


def test_configmap_worker_config() -> None:
    body = run(
        model={"path": "qwen3", "tokenizer": "tok", "volume": {"claimName": "models"}},
        data={"path": "nsmc/train.tsv", "format": "nsmc", "volume": {"claimName": "data"}},
        output={"volume": {"claimName": "runs"}},
        device={"backend": "cpu", "cards": 0, "compileCache": {"claimName": "c"}},
        image="x",
        suspend=False,
        queueName="q",
        podTemplate={"nodeSelector": {"a": "b"}},
        training={"steps": 5},
    )
    cm = b.build_configmap(body)
    assert cm["metadata"] == {
        "name": "r1-config",
        "namespace": "team",
        "labels": LABELS,
        "ownerReferences": [OWNER],
    }
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert cfg == {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": "r1", "namespace": "team"},
        "spec": {
            "model": {"path": "/mnt/model/qwen3", "tokenizer": "/mnt/model/tok"},
            "data": {"path": "/mnt/data/nsmc/train.tsv", "format": "nsmc"},
            "output": {"path": "/mnt/output/r1"},
            "device": {"backend": "cpu", "cards": 0},
            "training": {"steps": 5},
        },
    }
    # the worker accepts it as is
    load_manifest(cfg)


def test_example_data_path_not_rewritten() -> None:
    body = run(data={"path": "example:nsmc-mini", "volume": {"claimName": "d"}})
    cfg = yaml.safe_load(b.build_configmap(body)["data"]["config.yaml"])
    assert cfg["spec"]["data"]["path"] == "example:nsmc-mini"


def test_rbac() -> None:
    body = run()
    assert b.build_service_account(body) == {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": "r1-worker",
            "namespace": "team",
            "labels": LABELS,
            "ownerReferences": [OWNER],
        },
        "automountServiceAccountToken": True,
    }
    role = b.build_role(body)
    assert role["rules"] == [
        {
            "apiGroups": ["npu-lora.io"],
            "resources": ["moefinetunes/status"],
            "resourceNames": ["r1"],
            "verbs": ["get", "patch"],
        },
        {
            "apiGroups": ["npu-lora.io"],
            "resources": ["moefinetunes"],
            "resourceNames": ["r1"],
            "verbs": ["get"],
        },
    ]
    rb = b.build_role_binding(body)
    assert rb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "r1-worker",
    }
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "r1-worker", "namespace": "team"}]
    kinds = [o["kind"] for o in b.build_children(body, CFG)]
    assert kinds == ["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Job"]
    for o in b.build_children(body, CFG):
        assert o["metadata"]["ownerReferences"] == [OWNER]


def test_user_service_account_skips_rbac() -> None:
    body = run(podTemplate={"serviceAccountName": "trainer"})
    kinds = [o["kind"] for o in b.build_children(body, CFG)]
    assert kinds == ["ConfigMap", "Job"]
    job = b.build_job(body, CFG)
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "trainer"


def test_long_names_fit_limits() -> None:
    body = run(name="x" * 200)
    job = b.build_job(body, CFG)
    assert len(job["metadata"]["name"]) <= 52
    assert len(job["metadata"]["labels"]["npu-lora.io/run"]) <= 63
    assert job["metadata"]["annotations"]["npu-lora.io/run-name"] == "x" * 200
    assert b.job_name("x" * 200) == b.job_name("x" * 200)  # stable
    assert b.job_name("x" * 200) != b.job_name("x" * 199 + "y")


def test_reserved_env_cannot_be_overridden() -> None:
    body = run(
        podTemplate={
            "env": [
                {"name": "NPU_LORA_RESOURCE_NAME", "value": "other"},
                {"name": "HOME", "value": "/home/me"},
            ]
        }
    )
    env = b.build_job(body, CFG)["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.count("NPU_LORA_RESOURCE_NAME") == 1
    assert {"name": "NPU_LORA_RESOURCE_NAME", "value": "r1"} in env
    assert {"name": "HOME", "value": "/home/me"} in env and names.count("HOME") == 1


def test_builders_do_not_mutate_input() -> None:
    body = run(
        model={"path": "m", "volume": {"claimName": "x"}}, output={"volume": {"hostPath": "/o"}}
    )
    before = copy.deepcopy(body)
    b.build_children(body, CFG)
    assert body == before


def test_kueue_job_created_suspended() -> None:
    job = b.build_job(run(queueName="team-q"), CFG)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q"
    assert job["spec"]["suspend"] is True  # Kueue un-suspends it on admission


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a/b", "/mnt/output/a/b"),
        ("/a", "/mnt/output/a"),
    ],
)
def test_output_path_stays_in_the_volume(path: str, expected: str) -> None:
    assert b.output_path(run(output={"path": path})) == expected


@pytest.mark.parametrize("path", ["../../etc", "a/../../b", ".", "./"])
def test_output_path_that_climbs_or_names_the_volume_root_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match=r"output\.path"):
        b.output_path(run(output={"path": path}))
