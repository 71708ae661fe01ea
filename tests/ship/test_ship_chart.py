"""The Helm chart, rendered and linted by Helm's own Go engine (helm_python), validated against
the Kubernetes 1.32 schemas (kubernetes_validate, strict)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest
import yaml
from chart_util import (
    CHART,
    CHART_CRD,
    CRD_NAME,
    NAMESPACE,
    REPO_CRD,
    by_kind,
    objects,
    one,
    render,
    validate_k8s,
)

helm_python = pytest.importorskip("helm_python")

CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
#: every commonly overridden value changed at once (also rendered with the other ci/ files)
NON_DEFAULT = yaml.safe_load((CHART / "ci" / "non-default-values.yaml").read_text())


def _deployment(values=None):
    return one(objects(render(values)), "Deployment")


def _container(dep):
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return c


# ---------------------------------------------------------------------------------------------
# lint


def test_helm_lint_strict_has_no_errors_or_warnings():
    res = helm_python.lint(str(CHART), strict=True, kube_version="v1.32.0")
    assert res["errors"] == [], res
    # Helm severities: 1 info, 2 warning, 3 error. "icon is recommended" is info.
    bad = [m for m in res.get("messages", []) if m.get("severity", 0) >= 2]
    assert bad == [], bad


def test_helm_lint_with_non_default_values():
    res = helm_python.lint(str(CHART), NON_DEFAULT, strict=True, kube_version="v1.32.0")
    assert res["errors"] == [], res
    assert [m for m in res.get("messages", []) if m.get("severity", 0) >= 2] == []


def test_chart_metadata():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "npu-lora-operator"
    assert meta["appVersion"] == "0.1.0"
    import npu_lora

    assert meta["appVersion"] == npu_lora.__version__


# ---------------------------------------------------------------------------------------------
# rendering


@pytest.mark.parametrize("values", [{}, NON_DEFAULT], ids=["default", "non-default"])
def test_every_rendered_object_is_valid_kubernetes_1_32(values):
    objs = objects(render(values))
    kinds = sorted(o["kind"] for o in objs)
    assert {"Deployment", "ServiceAccount", "ClusterRole"} <= set(kinds), kinds
    for obj in objs:
        validate_k8s(obj)
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "npu-lora-operator"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "npu-lora-operator-0.1.0"
        assert labels["app.kubernetes.io/version"] == "0.1.0"


def test_chart_crd_is_valid_kubernetes_1_32():
    docs = [d for d in yaml.safe_load_all(CHART_CRD.read_text()) if d]
    assert len(docs) == 1
    validate_k8s(docs[0])
    assert docs[0]["metadata"]["name"] == "moefinetunes.npu-lora.io"


def test_default_deployment():
    dep = _deployment()
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    c = _container(dep)
    assert c["image"] == "npu-lora-operator:0.1.0"
    assert c["args"] == [
        "operator",
        "--all-namespaces",
        "--log-level=INFO",
        "--liveness=http://0.0.0.0:8080/healthz",
    ]
    env = {e["name"]: e for e in c["env"]}
    assert env["NPU_LORA_WORKER_IMAGE"]["value"] == "npu-lora-worker:0.1.0"
    probe = c["livenessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"
    port = {p["name"]: p["containerPort"] for p in c["ports"]}[probe["httpGet"]["port"]]
    assert port == 8080
    # hardened
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert pod["serviceAccountName"] == one(objects(render()), "ServiceAccount")["metadata"]["name"]
    for absent in (
        "nodeSelector",
        "tolerations",
        "affinity",
        "priorityClassName",
        "imagePullSecrets",
    ):
        assert absent not in pod


def test_non_default_deployment():
    dep = _deployment(NON_DEFAULT)
    assert dep["metadata"]["name"] == "npu-lora-op"
    pod = dep["spec"]["template"]["spec"]
    c = _container(dep)
    assert c["image"] == "registry.example.com/ml/npu-lora-operator:0.1.0-rc1"
    assert c["imagePullPolicy"] == "Always"
    assert c["args"] == [
        "operator",
        "--namespace=team-a",
        "--namespace=team-b",
        "--log-level=DEBUG",
        "--liveness=http://0.0.0.0:9090/livez",
        "--image-pull-policy=Always",
    ]
    env = {e["name"]: e for e in c["env"]}
    assert (
        env["NPU_LORA_WORKER_IMAGE"]["value"] == "registry.example.com/ml/npu-lora-worker:0.1.0-rc1"
    )
    assert env["NPU_LORA_WORKER_COMMAND"]["value"] == "npu-lora"
    assert c["resources"] == NON_DEFAULT["resources"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["health"] == 9090
    assert pod["nodeSelector"] == NON_DEFAULT["nodeSelector"]
    assert pod["tolerations"] == NON_DEFAULT["tolerations"]
    assert pod["affinity"] == NON_DEFAULT["affinity"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "npu-lora-op"
    meta = dep["spec"]["template"]["metadata"]
    assert meta["annotations"] == {"example.com/team": "ml"}
    assert meta["labels"]["team"] == "ml"
    # the selector stays the stable subset
    assert dep["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "npu-lora-operator",
        "app.kubernetes.io/instance": "npu-lora",
    }


def test_security_context_is_overridable():
    # Helm merges maps with the defaults: a key is changed by setting it, removed with null.
    dep = _deployment(
        {
            "securityContext": {"readOnlyRootFilesystem": False, "runAsUser": None},
            "podSecurityContext": {"fsGroup": 2000},
        }
    )
    sc = _container(dep)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is False
    assert "runAsUser" not in sc
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert dep["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 2000


def test_existing_service_account():
    objs = objects(render({"serviceAccount": {"create": False, "name": "mine"}}))
    assert by_kind(objs, "ServiceAccount") == []
    dep = one(objs, "Deployment")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "mine"
    assert all(
        s["name"] == "mine" for b in by_kind(objs, "ClusterRoleBinding") for s in b["subjects"]
    )
    with pytest.raises(helm_python.HelmError, match=r"serviceAccount\.name is required"):
        render({"serviceAccount": {"create": False}})


def test_rbac_can_be_disabled():
    objs = objects(render({"rbac": {"create": False}}))
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def test_names_and_namespace():
    objs = objects(render(name="npu-lora", namespace="ops"))
    assert one(objs, "Deployment")["metadata"]["name"] == "npu-lora-operator"
    assert one(objs, "Deployment")["metadata"]["namespace"] == "ops"
    objs = objects(render(name="prod"))
    assert one(objs, "Deployment")["metadata"]["name"] == "prod-npu-lora-operator"


def test_notes_render():
    notes = render()["npu-lora-operator/templates/NOTES.txt"]
    assert "kubectl get mft" in notes
    assert "all namespaces" in notes
    notes = render(NON_DEFAULT)["npu-lora-operator/templates/NOTES.txt"]
    assert "team-a, team-b" in notes


# ---------------------------------------------------------------------------------------------
# replicas and the values schema


def test_more_than_one_replica_fails_to_render():
    with pytest.raises(helm_python.HelmRenderError, match=r"replicas must be 1 or 0 \(got 2\)"):
        render({"replicas": 2})
    assert _deployment({"replicas": 0})["spec"]["replicas"] == 0


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"replicas": "one"}, "/replicas"),
        ({"watchNamespaces": "team-a"}, "/watchNamespaces"),
        ({"logLevel": "LOUD"}, "/logLevel"),
        ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"resources": {"requests": {"cpu": "1"}, "limit": {}}}, "limit"),
        ({"nodeSelector": {"a": 1}}, "/nodeSelector/a"),
        ({"tolerations": {"key": "x"}}, "/tolerations"),
        ({"extraArgs": "--x"}, "/extraArgs"),
        ({"replica": 1}, "replica"),
    ],
)
def test_values_schema_rejects_wrong_values(values, needle):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert needle in str(err.value)


def test_values_schema_shape():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert "replicas" in schema["required"] and "image" in schema["required"]
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(defaults) == set(schema["properties"]), "values.yaml and the schema disagree"
    with helm_python.Chart.load(str(CHART)) as chart:
        chart.validate_schema(defaults)


def test_every_values_key_is_commented():
    """Each key line of values.yaml (any depth) has a comment line right above it."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    missing = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w-]*):", line)
        if not m:
            continue
        prev = lines[i - 1].strip() if i else ""
        if not prev.startswith("#"):
            missing.append(f"line {i + 1}: {m.group(2)}")
    assert missing == []


# ---------------------------------------------------------------------------------------------
# the CRD copy and the operator's command line


def test_chart_crd_equals_repository_crd():
    assert REPO_CRD.is_file(), (
        f"crds/{CRD_NAME} is missing: generate it with `npu-lora crd --write crds/{CRD_NAME}`"
    )
    assert CHART_CRD.is_file(), f"charts/npu-lora-operator/crds/{CRD_NAME} is missing"
    assert CHART_CRD.read_text() == REPO_CRD.read_text(), (
        f"the chart's CRD differs from crds/{CRD_NAME}: "
        f"cp crds/{CRD_NAME} charts/npu-lora-operator/crds/"
    )


def test_chart_crd_equals_generated_crd():
    crd = pytest.importorskip("npu_lora_operator.crd")
    assert CHART_CRD.read_text() == crd.crd_yaml(), (
        f"stale: npu-lora crd --write charts/npu-lora-operator/crds/{CRD_NAME}"
    )


def test_helm_sees_the_crd_in_crds_dir_and_no_template_renders_one():
    with helm_python.Chart.load(str(CHART)) as chart:
        crds = chart.crds() if callable(chart.crds) else chart.crds
    assert [c["name"] for c in crds] == [f"crds/{CRD_NAME}"]
    assert crds[0]["data"] == CHART_CRD.read_text()
    assert all("CustomResourceDefinition" not in text for text in render().values())


@pytest.mark.parametrize("values", [{}, NON_DEFAULT], ids=["default", "non-default"])
def test_operator_cli_accepts_the_rendered_args(values):
    """The Deployment's args parse with `npu-lora operator`'s own argument parser."""
    from npu_lora import cli

    module_name = cli.SUBCOMMANDS["operator"][0]
    module = pytest.importorskip(module_name)
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices["operator"]  # same as cli.main
    module.add_arguments(sub)
    args = parser.parse_args(_container(_deployment(values))["args"])
    assert args.command == "operator"
    assert args.liveness.startswith("http://0.0.0.0:")
    if values.get("watchNamespaces"):
        assert module.namespaces_from(args) == values["watchNamespaces"]
    else:
        assert module.namespaces_from(args) == []
    assert args.log_level == values.get("logLevel", "INFO")


def test_operator_reads_the_worker_image_the_chart_sets():
    settings = pytest.importorskip("npu_lora_operator.settings")
    env = {e["name"]: e.get("value") for e in _container(_deployment(NON_DEFAULT))["env"]}
    config = settings.OperatorConfig.from_env(env)
    assert config.worker_image == "registry.example.com/ml/npu-lora-worker:0.1.0-rc1"


def test_default_namespace_constant():
    assert NAMESPACE == "npu-lora"


# ---------------------------------------------------------------------------------------------
# ci/ values files and the generated README


@pytest.mark.parametrize("path", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_ci_values_render_valid_kubernetes_and_lint(path):
    values = yaml.safe_load(path.read_text()) or {}
    objs = objects(render(values))
    assert one(objs, "Deployment")["spec"]["replicas"] == values.get("replicas", 1)
    for obj in objs:
        validate_k8s(obj)
    res = helm_python.lint(str(CHART), values, strict=True, kube_version="v1.32.0")
    assert res["errors"] == [], res
    assert [m for m in res.get("messages", []) if m.get("severity", 0) >= 2] == []


def test_ci_values_cover_the_cases():
    names = {p.name for p in CI_VALUES}
    assert {"default-values.yaml", "non-default-values.yaml"} <= names, names


def _chart_readme():
    spec = importlib.util.spec_from_file_location(
        "chart_readme", CHART.parents[1] / "scripts" / "chart_readme.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


def test_chart_readme_is_generated_from_values():
    gen = _chart_readme()
    assert (CHART / "README.md").read_text() == gen.render_readme(), (
        "charts/npu-lora-operator/README.md is stale: run python scripts/chart_readme.py"
    )
    keys = [v.key for v in gen.parse_values((CHART / "values.yaml").read_text())]
    assert "liveness.port" in keys and "securityContext.capabilities.drop" in keys
    for path in CI_VALUES:
        assert f"`ci/{path.name}`" in (CHART / "README.md").read_text()


def test_chart_readme_generator_needs_a_description_per_key():
    gen = _chart_readme()
    rows = gen.parse_values(
        "# -- The answer.\nanswer: 42\n# -- Nested.\na:\n  # -- Leaf.\n  b: [x]\n"
    )
    assert [(v.key, v.type, v.default, v.description) for v in rows] == [
        ("answer", "int", "`42`", "The answer."),
        ("a", "object", "", "Nested."),
        ("a.b", "list", '`["x"]`', "Leaf."),
    ]
    with pytest.raises(ValueError, match=r"without a `# --` description: a\.b"):
        gen.parse_values("# -- Nested.\na:\n  # plain comment\n  b: 1\n")
