"""The chart's admission-policy values reach the operator as it reads them, and the sandbox's
operator runs under the chart's ClusterRole rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

helm_python = pytest.importorskip("helm_python")
policy = pytest.importorskip("npu_lora_operator.policy")

from chart_util import CHART, by_kind, objects, one, render  # noqa: E402

POLICY_VALUES = CHART / "ci" / "policy-values.yaml"


def _env(values: dict) -> dict[str, str]:
    dep = one(objects(render(values)), "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in c["env"]}


def test_default_values_render_the_operators_default_policy() -> None:
    from npu_lora_operator.settings import OperatorConfig

    env = _env({})
    assert json.loads(env["NPU_LORA_POLICY"])["allowedImages"] == []
    # the chart's defaults are the operator's own: one documented default, not two
    assert OperatorConfig.from_env(env).policy == policy.PodPolicy()


def test_policy_values_reach_the_operator() -> None:
    from npu_lora_operator.settings import OperatorConfig

    values = yaml.safe_load(POLICY_VALUES.read_text())
    p = OperatorConfig.from_env(_env(values)).policy
    assert p.allowed_images == ("registry.example.com/ml/*",)
    assert p.allowed_service_accounts == ("trainer",)
    assert p.allowed_host_paths == ("/srv/npu-lora",)
    assert p.allow_privileged is False
    # Helm merges maps: `memory: null` drops the default auto memory limit
    assert p.defaults("requests") == {"cpu": "4", "memory": "auto"}
    assert p.defaults("limits") == {"cpu": "16"}
    assert p.memory_when_unknown == "64Gi"


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"policy": {"allowedImage": ["x"]}}, "allowedImage"),
        ({"policy": {"allowedHostPaths": ["srv"]}}, "/policy/allowedHostPaths/0"),
        ({"policy": {"allowPrivileged": "no"}}, "/policy/allowPrivileged"),
        ({"policy": {"defaultResources": {"requests": {"memory": "lots"}}}}, "memory"),
        ({"policy": {"memoryWhenUnknown": "auto"}}, "/policy/memoryWhenUnknown"),
    ],
)
def test_values_schema_rejects_wrong_policy_values(values: dict, needle: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert needle in str(err.value)


def test_sandbox_operator_runs_under_the_charts_cluster_role() -> None:
    from npu_lora_sandbox.command import chart_operator_rules

    (role,) = by_kind(objects(render({})), "ClusterRole")
    assert chart_operator_rules() == role["rules"]
    assert Path(CHART / "templates" / "rbac.yaml").exists()


def _vap_rules(values: dict) -> list[dict]:
    objs = objects(render(values))
    (vap,) = by_kind(objs, "ValidatingAdmissionPolicy")
    (binding,) = by_kind(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    return vap["spec"]["validations"]


def _refused(rules: list[dict], spec: dict) -> list[str]:
    """The messages of the rules the object fails, evaluated with cel-python (as the API server
    evaluates them with cel-go)."""
    schema = pytest.importorskip("npu_lora_sandbox.schema")
    obj = schema.to_cel({"spec": {"model": {"preset": "tiny-qwen3-moe"}, **spec}}, None)
    out = []
    for rule in rules:
        if not bool(schema._cel_eval(rule["expression"], {"object": obj})):
            out.append(rule["message"].split(":")[0])
    return out


def test_validating_admission_policy_is_off_by_default() -> None:
    objs = objects(render({}))
    assert by_kind(objs, "ValidatingAdmissionPolicy") == []
    assert by_kind(objs, "ValidatingAdmissionPolicyBinding") == []


def test_validating_admission_policy_refuses_the_static_cases() -> None:
    rules = _vap_rules({"validatingAdmissionPolicy": {"enabled": True}})
    worker = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert _refused(rules, {}) == []
    assert _refused(rules, {"image": f"npu-lora-worker:{worker}"}) == []
    assert _refused(rules, {"image": "docker.io/evil/miner:latest"}) == ["spec.image"]
    assert _refused(rules, {"image": f"npu-lora-worker:{worker}x"}) == ["spec.image"]
    assert _refused(rules, {"podTemplate": {"serviceAccountName": "default"}}) == [
        "spec.podTemplate.serviceAccountName"
    ]
    assert _refused(rules, {"output": {"volume": {"hostPath": "/"}}}) == [
        "spec.output.volume.hostPath"
    ]
    assert _refused(rules, {"output": {"volume": {"claimName": "runs"}}}) == []
    vols = {
        "volumes": [
            {"name": "a", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "h", "hostPath": {"path": "/"}},
        ]
    }
    assert _refused(rules, {"podTemplate": vols}) == ["spec.podTemplate.volumes"]
    assert _refused(rules, {"device": {"compileCache": {"hostPath": "/c"}}}) == [
        "spec.device.compileCache.hostPath"
    ]


def test_validating_admission_policy_follows_the_policy_values() -> None:
    values = yaml.safe_load((CHART / "ci" / "admission-policy-values.yaml").read_text())
    rules = _vap_rules(values)
    assert _refused(rules, {"image": "registry.example.com/ml/worker:2"}) == []
    assert _refused(rules, {"image": "registry.example.com/mlx/worker:2"}) == ["spec.image"]
    assert _refused(rules, {"podTemplate": {"serviceAccountName": "trainer"}}) == []
    assert _refused(rules, {"podTemplate": {"serviceAccountName": "trainer2"}}) != []
    # hostPath prefixes need path normalisation: the operator checks them, not CEL
    allowed = _vap_rules({**values, "policy": {**values["policy"], "allowedHostPaths": ["/srv"]}})
    assert _refused(allowed, {"output": {"volume": {"hostPath": "/srv/x"}}}) == []


# -- issue 28: the podTemplate allow-list in the ValidatingAdmissionPolicy ----------------------


def _vap_default() -> list[dict]:
    return _vap_rules({"validatingAdmissionPolicy": {"enabled": True}})


@pytest.mark.parametrize(
    ("pt", "field"),
    [
        ({"env": [{"name": "PYTHONPATH", "value": "/x"}]}, "spec.podTemplate.env"),
        ({"env": [{"name": "ld_preload", "value": "/x"}]}, "spec.podTemplate.env"),
        ({"env": [{"name": "HOME", "value": "/x"}]}, "spec.podTemplate.env"),
        (
            {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]},
            "spec.podTemplate.env",
        ),
        ({"envFrom": [{"secretRef": {"name": "db"}, "prefix": "A_"}]}, "spec.podTemplate.envFrom"),
        ({"volumes": [{"name": "s", "secret": {"secretName": "db"}}]}, "spec.podTemplate.volumes"),
        ({"volumes": [{"name": "p", "projected": {"sources": []}}]}, "spec.podTemplate.volumes"),
        (
            {"volumeMounts": [{"name": "v", "mountPath": "/data/v", "subPath": "../x"}]},
            "spec.podTemplate.volumeMounts",
        ),
        (
            {
                "volumeMounts": [
                    {"name": "v", "mountPath": "/d", "mountPropagation": "Bidirectional"}
                ]
            },
            "spec.podTemplate.volumeMounts",
        ),
        (
            {
                "tolerations": [
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                ]
            },
            "spec.podTemplate.tolerations",
        ),
        ({"tolerations": [{"operator": "Exists"}]}, "spec.podTemplate.tolerations"),
        (
            {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}},
            "spec.podTemplate.nodeSelector",
        ),
        ({"priorityClassName": "system-node-critical"}, "spec.podTemplate.priorityClassName"),
        ({"affinity": {"podAffinity": {}}}, "spec.podTemplate.affinity.podAffinity"),
    ],
)
def test_validating_admission_policy_refuses_hostile_pod_templates(pt: dict, field: str) -> None:
    assert field in _refused(_vap_default(), {"podTemplate": pt})


def test_validating_admission_policy_admits_what_the_operator_admits() -> None:
    pt = {
        "env": [
            {"name": "WANDB_MODE", "value": "offline"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm", "subPath": "a/b"}],
        "tolerations": [{"key": "furiosa.ai/rngd", "operator": "Exists"}],
        "nodeSelector": {"furiosa.ai/model": "rngd"},
    }
    assert _refused(_vap_default(), {"podTemplate": pt}) == []
    r = policy.check_pod_template(pt, policy.PodPolicy())
    assert r == []


def test_validating_admission_policy_follows_the_new_policy_lists() -> None:
    values = {
        "validatingAdmissionPolicy": {"enabled": True},
        "policy": {
            "allowedSecrets": ["db"],
            "allowedPriorityClasses": ["batch-*", "system-cluster-critical"],
            "allowedTolerationKeys": ["*"],
        },
    }
    rules = _vap_rules(values)
    sec = {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]}
    assert _refused(rules, {"podTemplate": sec}) == []
    assert _refused(rules, {"podTemplate": {"priorityClassName": "batch-low"}}) == []
    assert _refused(rules, {"podTemplate": {"priorityClassName": "system-cluster-critical"}}) == []
    assert _refused(rules, {"podTemplate": {"priorityClassName": "system-node-critical"}}) != []
    assert _refused(rules, {"podTemplate": {"tolerations": [{"operator": "Exists"}]}}) == []
    cp = {"tolerations": [{"key": "node-role.kubernetes.io/master", "operator": "Exists"}]}
    assert _refused(rules, {"podTemplate": cp}) != []  # `*` never reaches the control plane


def test_vap_reserved_env_lists_match_the_operator() -> None:
    text = (CHART / "templates" / "admissionpolicy.yaml").read_text()
    for name in policy.RESERVED_ENV_NAMES:
        assert f'"{name}"' in text, name
    for prefix in policy.RESERVED_ENV_PREFIXES:
        assert f'"{prefix}"' in text, prefix


def test_vap_pull_secrets_and_empty_dirs_follow_the_policy() -> None:
    default = _vap_default()
    pull = {"imagePullSecrets": [{"name": "regcred"}]}
    assert _refused(default, {"podTemplate": pull}) == ["spec.podTemplate.imagePullSecrets"]
    listed = _vap_rules(
        {
            "validatingAdmissionPolicy": {"enabled": True},
            "policy": {"allowedImagePullSecrets": ["regcred", "team-*"]},
        }
    )
    assert _refused(listed, {"podTemplate": pull}) == []
    assert _refused(listed, {"podTemplate": {"imagePullSecrets": [{"name": "team-a"}]}}) == []
    for name in ("admin", "regcred-x", "xregcred"):
        pt = {"imagePullSecrets": [{"name": name}]}
        assert _refused(listed, {"podTemplate": pt}) == ["spec.podTemplate.imagePullSecrets"]
    for src in ({}, {"medium": "Memory"}, {"medium": "HugePages", "sizeLimit": "1Gi"}):
        pt = {"volumes": [{"name": "s", "emptyDir": src}]}
        assert _refused(default, {"podTemplate": pt}) == ["spec.podTemplate.volumes"], src
        assert policy.check_pod_template(pt, policy.PodPolicy()), src  # the operator agrees
    ok = {"volumes": [{"name": "s", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]}
    assert _refused(default, {"podTemplate": ok}) == []


def test_policy_values_schema_checks_the_new_keys() -> None:
    for values, needle in (
        ({"policy": {"maxEmptyDirSize": "lots"}}, "/policy/maxEmptyDirSize"),
        ({"policy": {"maxMemoryEmptyDirSize": "-1Gi"}}, "/policy/maxMemoryEmptyDirSize"),
        ({"policy": {"allowedImagePullSecrets": [""]}}, "/policy/allowedImagePullSecrets/0"),
    ):
        with pytest.raises(helm_python.HelmValuesError) as err:
            render(values)
        assert needle in str(err.value)


def test_vap_config_map_volumes_and_duplicate_env_follow_the_operator() -> None:
    default = _vap_default()
    cm = {"volumes": [{"name": "c", "configMap": {"name": "r0-config"}}]}
    assert _refused(default, {"podTemplate": cm}) == ["spec.podTemplate.volumes"]
    assert policy.check_pod_template(cm, policy.PodPolicy())  # the operator agrees
    listed = _vap_rules(
        {"validatingAdmissionPolicy": {"enabled": True}, "policy": {"allowedConfigMaps": ["app"]}}
    )
    ok = {"volumes": [{"name": "c", "configMap": {"name": "app"}}]}
    assert _refused(listed, {"podTemplate": ok}) == []
    assert _refused(listed, {"podTemplate": cm}) == ["spec.podTemplate.volumes"]
    dup = {"env": [{"name": "APP", "value": "1"}, {"name": "APP", "value": "2"}]}
    assert _refused(default, {"podTemplate": dup}) == ["spec.podTemplate.env"]
    assert policy.check_pod_template(dup, policy.PodPolicy())
    for name in ("HTTPS_PROXY", "cxx", "NVIDIA_VISIBLE_DEVICES", "GCONV_PATH"):
        pt = {"env": [{"name": name, "value": "x"}]}
        assert _refused(default, {"podTemplate": pt}) == ["spec.podTemplate.env"], name
