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
