"""A third hostile pass over what a run's author can shape (issue 28's hidden set): podTemplate
fields the API has no place for, env names the shell/glibc/compiler/HTTPS client read, env
values the kubelet expands, ConfigMap volumes, malformed scheduling terms, ``$(VAR)`` in the
worker's arguments, names that collide, and the built pod's remaining privileged settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import config as kconfig
from npu_lora_operator import builders as b
from npu_lora_operator import handlers
from npu_lora_operator import policy as pol
from npu_lora_operator.crd import build_crd
from npu_lora_operator.kube import Kube
from npu_lora_operator.policy.env import WORKER_CONTAINER
from npu_lora_operator.settings import OperatorConfig
from policy_runs import run

WORKER = "reg/npu-lora-worker:1"
FAST = pol.PodPolicy(default_resources=())


def fields(pt: dict[str, Any], policy: pol.PodPolicy = FAST, **spec: Any) -> list[str]:
    r = run(podTemplate=pt, **spec)
    return [v.field for v in pol.check_spec(r.spec, policy, WORKER)]


# --- podTemplate fields that would reach the pod if the API had a place for them ---------------

POD_FIELDS = {
    "shareProcessNamespace": True,
    "hostUsers": True,
    "hostAliases": [{"ip": "10.0.0.9", "hostnames": ["kubernetes.default.svc"]}],
    "dnsPolicy": "None",
    "dnsConfig": {"nameservers": ["10.0.0.9"]},
    "runtimeClassName": "unsandboxed",
    "schedulerName": "my-scheduler",
    "nodeName": "control-plane-0",
    "overhead": {"cpu": "0"},
    "os": {"name": "windows"},
    "securityContext": {"sysctls": [{"name": "kernel.core_pattern", "value": "|/x"}]},
    "initContainers": [{"name": "i", "image": "evil:1"}],
    "ephemeralContainers": [{"name": "e", "image": "evil:1"}],
    "containers": [{"name": "sidecar", "image": "evil:1"}],
    "lifecycle": {"postStart": {"exec": {"command": ["sh"]}}},
    "livenessProbe": {"exec": {"command": ["sh"]}},
    "command": ["sh", "-c", "id"],
    "image": "evil:1",
    "labels": {"job-name": "other", "batch.kubernetes.io/controller-uid": "x"},
    "annotations": {"kueue.x-k8s.io/queue-name": "other"},
    "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "other"}},
    "hostNetwork": True,
    "hostPID": True,
    "automountServiceAccountToken": True,
    "enableServiceLinks": True,
    "priority": 2_000_000_000,
    "preemptionPolicy": "PreemptLowerPriority",
    "schedulingGates": [{"name": "x"}],
    "resourceClaims": [{"name": "x"}],
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 2**62,
}


@pytest.mark.parametrize("name", sorted(POD_FIELDS))
def test_pod_fields_outside_the_api_are_refused_and_never_rendered(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        run(podTemplate={name: POD_FIELDS[name]})
    # the CRD has no such property under podTemplate and keeps no unknown fields there: the
    # API server prunes it (or refuses it under fieldValidation=Strict)
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pt = schema["properties"]["spec"]["properties"]["podTemplate"]
    assert name not in pt["properties"]
    assert not pt.get("x-kubernetes-preserve-unknown-fields")


# --- env ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "NO_PROXY",
        "SSLKEYLOGFILE",
        "CC",
        "CXX",
        "CXXFLAGS",
        "LDFLAGS",
        "CPATH",
        "CPLUS_INCLUDE_PATH",
        "LIBRARY_PATH",
        "MAX_JOBS",
        "CCACHE_DIR",
        "GCONV_PATH",
        "LOCPATH",
        "HOSTALIASES",
        "RES_OPTIONS",
        "LOCALDOMAIN",
        "PS4",
        "PROMPT_COMMAND",
        "SHELLOPTS",
        "BASH_FUNC_X",
        "IFS",
        "NVIDIA_VISIBLE_DEVICES",
        "nvidia_driver_capabilities",
        "ONEDNN_JIT_DUMP",
    ],
)
def test_env_names_that_run_code_redirect_traffic_or_reach_devices_are_refused(name: str) -> None:
    assert fields({"env": [{"name": name, "value": "/mnt/extra/x"}]}) == [
        "spec.podTemplate.env[0].name"
    ]


def test_env_names_are_unique() -> None:
    env = [{"name": "APP_A", "value": "1"}, {"name": "APP_A", "value": "2"}]
    assert fields({"env": env}) == ["spec.podTemplate.env[1].name"]
    assert fields({"env": [{"name": "APP_A", "value": "1"}, {"name": "app_a", "value": "2"}]}) == []


def test_a_value_the_kubelet_expands_is_not_a_literal_for_sub_path_expr() -> None:
    # APP_P's "$(APP_S)" is expanded by the kubelet: its value is APP_S's, unknown here
    pt = {
        "env": [
            {"name": "APP_S", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "APP_P", "value": "$(APP_S)"},
            {"name": "APP_OK", "value": "shards"},
        ],
        "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1Gi"}}],
        "volumeMounts": [{"name": "v", "mountPath": "/data/v", "subPathExpr": "$(APP_P)"}],
    }
    assert fields(pt) == ["spec.podTemplate.volumeMounts[0].subPathExpr"]
    pt["volumeMounts"][0]["subPathExpr"] = "$(APP_OK)/a"
    assert fields(pt) == []


@pytest.mark.parametrize(
    ("value_from", "field"),
    [
        ({"fieldRef": {"fieldPath": "metadata.name", "x": 1}}, "fieldRef.x"),
        ({"resourceFieldRef": {"resource": "limits.cpu", "containerName": "x"}}, "containerName"),
        ({"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}, "resource"),
        ({"resourceFieldRef": {"resource": "limits.cpu", "x": 1}}, "resourceFieldRef.x"),
        ({"configMapKeyRef": {"name": "app", "key": "k", "namespace": "kube-system"}}, "namespace"),
        ({"secretKeyRef": {"name": "db", "key": "k", "namespace": "kube-system"}}, "namespace"),
    ],
)
def test_pod_field_sources_are_checked_key_by_key(value_from: dict, field: str) -> None:
    allow = pol.PodPolicy(
        default_resources=(), allowed_secrets=("db",), allowed_config_maps=("app",)
    )
    (got,) = fields({"env": [{"name": "APP", "valueFrom": value_from}]}, allow)
    assert got.endswith(field), got


def test_env_from_refs_are_checked_key_by_key() -> None:
    allow = pol.PodPolicy(default_resources=(), allowed_secrets=("db",))
    ok = {"secretRef": {"name": "db", "optional": True}, "prefix": "APP_"}
    assert fields({"envFrom": [ok]}, allow) == []
    bad = {"secretRef": {"name": "db", "namespace": "kube-system"}, "prefix": "APP_"}
    assert fields({"envFrom": [bad]}, allow) == ["spec.podTemplate.envFrom[0].secretRef.namespace"]


def test_resource_field_ref_of_the_worker_is_allowed() -> None:
    ok = {"resourceFieldRef": {"containerName": WORKER_CONTAINER, "resource": "limits.memory"}}
    assert fields({"env": [{"name": "APP_MEM", "valueFrom": ok}]}) == []
    assert WORKER_CONTAINER == b.CONTAINER_NAME


# --- configMap volumes --------------------------------------------------------------------------


def _cm(src: dict[str, Any]) -> dict[str, Any]:
    return {
        "volumes": [{"name": "v", "configMap": src}],
        "volumeMounts": [{"name": "v", "mountPath": "/mnt/extra/v", "readOnly": True}],
    }


def test_config_map_volumes_read_only_the_allowed_config_maps() -> None:
    # the same rule as env from a ConfigMap (another run's `<name>-config` included)
    assert fields(_cm({"name": "r0-config"})) == ["spec.podTemplate.volumes[0].configMap.name"]
    allow = pol.PodPolicy(default_resources=(), allowed_config_maps=("app-*",))
    assert fields(_cm({"name": "app-settings"}), allow) == []
    assert fields(_cm({"name": "r0-config"}), allow) == [
        "spec.podTemplate.volumes[0].configMap.name"
    ]


@pytest.mark.parametrize(
    ("src", "field"),
    [
        ({"items": [{"key": "a", "path": "a", "mode": 0o4755}]}, "items[0].mode"),
        ({"items": [{"key": "a", "path": "a", "evil": 1}]}, "items[0].evil"),
        ({"items": [{"key": "a", "path": "../a"}]}, "items[0].path"),
        ({"items": "a"}, "items"),
        ({"defaultMode": 0o2777}, "defaultMode"),
        ({"defaultMode": True}, "defaultMode"),
    ],
)
def test_config_map_items_and_modes_are_checked(src: dict, field: str) -> None:
    allow = pol.PodPolicy(default_resources=(), allowed_config_maps=("app",))
    assert fields(_cm({"name": "app", **src}), allow) == [
        f"spec.podTemplate.volumes[0].configMap.{field}"
    ]


def test_host_path_volume_keys_are_checked() -> None:
    allow = pol.PodPolicy(default_resources=(), allowed_host_paths=("/srv/ok",))
    pt = {"volumes": [{"name": "h", "hostPath": {"path": "/srv/ok/a", "server": "x"}}]}
    assert fields(pt, allow) == ["spec.podTemplate.volumes[0].hostPath.server"]


# --- scheduling ---------------------------------------------------------------------------------

_REQ = "requiredDuringSchedulingIgnoredDuringExecution"
_PREF = "preferredDuringSchedulingIgnoredDuringExecution"


def _node_expr(**expr: Any) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "furiosa.ai/model", "operator": "In", **expr}]}
    return {"affinity": {"nodeAffinity": {_REQ: {"nodeSelectorTerms": [term]}}}}


@pytest.mark.parametrize(
    ("pt", "suffix"),
    [
        ({"tolerations": [{"key": "furiosa.ai/*", "operator": "Exists"}]}, "key"),
        ({"tolerations": [{"key": "furiosa.ai/rngd", "value": "a b"}]}, "value"),
        (
            {"tolerations": [{"key": "furiosa.ai/rngd", "tolerationSeconds": 2**64}]},
            "tolerationSeconds",
        ),
        ({"tolerations": [{"key": "furiosa.ai/rngd", "tolerationSeconds": True}]}, "Seconds"),
        ({"nodeSelector": {"furiosa.ai/model": "rngd x"}}, '"furiosa.ai/model"]'),
        (_node_expr(values=["9" * 64]), "values"),
        (_node_expr(values=["rngd"], extra=1), "extra"),
        (_node_expr(operator="Matches"), "operator"),
        ({"affinity": {"nodeAffinity": {_REQ: {"nodeSelectorTerms": []}}}}, "nodeSelectorTerms"),
        (
            {"affinity": {"nodeAffinity": {_REQ: {"nodeSelectorTerms": [{}], "x": 1}}}},
            f"{_REQ}.x",
        ),
        (
            {"affinity": {"nodeAffinity": {_PREF: [{"weight": 1, "preference": {}, "x": 1}]}}},
            "[0].x",
        ),
        (
            {"affinity": {"nodeAffinity": {_PREF: [{"weight": 1000, "preference": {}}]}}},
            "[0].weight",
        ),
        ({"affinity": {"podAntiAffinity": {"hostNetwork": True}}}, "podAntiAffinity.hostNetwork"),
        ({"affinity": {"podAntiAffinity": []}}, "podAntiAffinity"),
    ],
)
def test_malformed_scheduling_terms_are_refused_before_the_job(pt: dict, suffix: str) -> None:
    # the API server would refuse the Job (or its pods) later; the run would never start
    found = fields(pt)
    assert found and any(f.endswith(suffix) for f in found), found


def test_well_formed_scheduling_terms_pass() -> None:
    pt = {
        **_node_expr(values=["rngd"]),
        "tolerations": [{"key": "furiosa.ai/rngd", "value": "x", "tolerationSeconds": 60}],
        "nodeSelector": {"furiosa.ai/model": "rngd"},
    }
    assert fields(pt) == []


# --- the worker's arguments: the kubelet expands $(VAR) -----------------------------------------


def test_output_path_with_a_variable_reference_reaches_the_worker_verbatim() -> None:
    r = run(
        output={"path": "$(APP_TOKEN)/$(NPU_LORA_RESOURCE_UID)"},
        podTemplate={"env": [{"name": "APP_TOKEN", "value": ".."}]},
    )
    assert pol.check_spec(r.spec, FAST, WORKER) == []
    (c,) = b.build_job(r, OperatorConfig(worker_image=WORKER))["spec"]["template"]["spec"][
        "containers"
    ]
    # `$$` is the kubelet's escape for a literal `$`: the worker gets the path as written
    assert c["command"][-1] == "/mnt/output/$$(APP_TOKEN)/$$(NPU_LORA_RESOURCE_UID)"
    assert b.worker_config(r)["spec"]["output"]["path"] == (
        "/mnt/output/$(APP_TOKEN)/$(NPU_LORA_RESOURCE_UID)"
    )
    assert all("$(" not in a.replace("$$", "") for a in c["command"])


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("a//b", "/mnt/output/a/b"),
        ("a/.", "/mnt/output/a"),
        ("/etc", "/mnt/output/etc"),
        ("...", "/mnt/output/..."),
    ],
)
def test_odd_output_paths_stay_inside_the_output_volume(path: str, inside: str) -> None:
    assert b.output_path(run(output={"path": path})) == inside


# --- names --------------------------------------------------------------------------------------


def test_a_name_equal_to_another_runs_shortened_job_name_is_a_conflict_not_a_loop(
    emulator: Any, kubeconfig: Path
) -> None:
    long = "a" * 60
    crafted = b.job_name(long)  # a valid name of its own, 52 characters: used as it is
    assert len(crafted) == 52 and crafted == b.job_name(crafted)
    spec = {"model": {"preset": "tiny-qwen3-moe"}, "data": {"path": "example:x"}}
    meta = {"namespace": "default"}
    ra = b.Run.from_body({"metadata": {**meta, "name": long, "uid": "ua"}, "spec": spec})
    rb = b.Run.from_body({"metadata": {**meta, "name": crafted, "uid": "ub"}, "spec": spec})
    config = OperatorConfig(worker_image=WORKER)
    ja, jb = b.build_job(ra, config), b.build_job(rb, config)
    assert ja["metadata"]["name"] == jb["metadata"]["name"]
    client = kconfig.new_client_from_config(config_file=str(kubeconfig))
    try:
        kube = Kube(client)
        handlers.ensure_object(kube, ja, ra)
        # not a predecessor (another run's name): a conflict at once, no retry loop
        with pytest.raises(handlers.ChildConflict, match=f"Job default/{crafted}"):
            handlers.ensure_object(kube, jb, rb)
    finally:
        client.close()
    job = emulator.get("batch/v1", "Job", crafted, namespace="default")
    assert job["metadata"]["ownerReferences"][0]["uid"] == "ua"  # untouched


def test_unicode_and_overlong_names_are_refused_by_the_crd() -> None:
    # The API server holds a custom resource's name to a DNS-1123 subdomain
    # (apiextensions-apiserver customresource/validator.go: NameIsDNSSubdomain, as the
    # sandbox's store does); the CRD's root CEL rule narrows it to a DNS-1123 label (a Job, a
    # label value and a Service derive from it)
    schema = pytest.importorskip("npu_lora_sandbox.schema")
    from npu_lora_sandbox.resources import DNS_SUBDOMAIN

    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (rule,) = [r for r in root["x-kubernetes-validations"] if "metadata.name" in r["rule"]]
    for name, ok in (
        ("r1", True),
        ("a" * 63, True),
        ("rün", False),
        ("r\u0131", False),
        ("a" * 64, False),
        ("R1", False),
        ("r_1", False),
        ("r.1", False),
    ):
        obj = schema.to_cel({"metadata": {"name": name}}, None)
        subdomain = len(name) <= 253 and DNS_SUBDOMAIN.match(name) is not None
        assert (subdomain and bool(schema._cel_eval(rule["rule"], {"self": obj}))) is ok, name


# --- the built pod ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, "seccompProfile.type"),
        ({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}, "appArmorProfile.type"),
        ({"securityContext": {"sysctls": [{"name": "kernel.x", "value": "1"}]}}, "sysctls"),
        ({"shareProcessNamespace": True}, "shareProcessNamespace"),
        ({"ephemeralContainers": [{"name": "e"}]}, "ephemeralContainers"),
        (
            {"securityContext": {"windowsOptions": {"hostProcess": True}}},
            "windowsOptions.hostProcess",
        ),
    ],
)
def test_the_built_pods_remaining_privileged_settings_are_refused(patch: dict, field: str) -> None:
    pod = b.build_job(run(), OperatorConfig(worker_image=WORKER))["spec"]["template"]["spec"]
    assert pol.check_pod_spec(pod, "p") == []
    found = [v.field for v in pol.check_pod_spec({**pod, **patch}, "p")]
    assert found == [f"p.{'securityContext.' if 'securityContext' in patch else ''}{field}"]


@pytest.mark.parametrize(
    "ctx",
    [
        {"procMount": "Unmasked"},
        {"seccompProfile": {"type": "Unconfined"}},
        {"capabilities": {"add": ["SYS_ADMIN"]}},
        {"allowPrivilegeEscalation": True},
        {"runAsUser": 0},
    ],
)
def test_container_security_contexts_are_checked(ctx: dict) -> None:
    pod = b.build_job(run(), OperatorConfig(worker_image=WORKER))["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    bad = {**pod, "containers": [{**c, "securityContext": {**c["securityContext"], **ctx}}]}
    (v,) = pol.check_pod_spec(bad, "p")
    assert v.field.startswith("p.containers[0].securityContext.")
