"""The podTemplate allow-list (npu_lora_operator.policy.check_pod_template): hostile templates
are refused with the field named and no value echoed; what passes renders a pod that uses only
allowed images, volumes, env sources, tolerations and priority classes (a property test)."""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from npu_lora_operator import builders as b
from npu_lora_operator import policy as pol
from npu_lora_operator.policy.common import under
from npu_lora_operator.policy.env import prefix_can_form_reserved
from npu_lora_operator.settings import OperatorConfig
from policy_runs import run

WORKER = "reg/npu-lora-worker:1"
#: no auto memory (the estimate imports the worker's pre-flight; not what is tested here)
FAST = pol.PodPolicy(default_resources=())
SECRET = "s3cr3t-value-never-echoed"


def fields(pt: dict[str, Any], policy: pol.PodPolicy = FAST, **spec: Any) -> list[str]:
    r = run(podTemplate=pt, **spec)
    return [v.field for v in pol.check_spec(r.spec, policy, WORKER)]


def messages(pt: dict[str, Any], policy: pol.PodPolicy = FAST) -> str:
    r = run(podTemplate=pt)
    return pol.describe(pol.check_spec(r.spec, policy, WORKER))


# --- env ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "pythonpath",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "HOME",
        "PATH",
        "XDG_CACHE_HOME",
        "NPU_LORA_RESOURCE_UID",
        "NPU_LORA_DATA_ROOT",
        "TORCH_DEVICE_BACKEND_AUTOLOAD",
        "TORCHINDUCTOR_CACHE_DIR",
        "FURIOSA_LOG_LEVEL",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "MASTER_ADDR",
        "WORLD_SIZE",
        "KUBECONFIG",
        "BASH_ENV",
        "HF_HOME",
        "SSL_CERT_FILE",
    ],
)
def test_env_names_the_worker_owns_are_refused(name: str) -> None:
    assert fields({"env": [{"name": name, "value": "x"}]}) == ["spec.podTemplate.env[0].name"]


def test_env_may_not_override_the_operators_configured_env() -> None:
    r = run(podTemplate={"env": [{"name": "HTTPS_PROXY", "value": "http://evil:3128"}]})
    found = pol.check_spec(r.spec, FAST, WORKER, operator_env=["HTTPS_PROXY"])
    assert [v.field for v in found] == ["spec.podTemplate.env[0].name"]
    assert "evil" not in found[0].message


def test_env_of_plain_names_is_allowed() -> None:
    assert fields({"env": [{"name": "WANDB_MODE", "value": "offline"}, {"name": "MY_FLAG"}]}) == []


def test_env_value_from_a_secret_is_refused_unless_allowed_and_never_echoed() -> None:
    pt = {"env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}]}
    assert fields(pt) == ["spec.podTemplate.env[0].valueFrom.secretKeyRef.name"]
    assert "no Secret is allowed" in messages(pt)
    allow = pol.PodPolicy(default_resources=(), allowed_secrets=("db",))
    assert fields(pt, allow) == []
    # another Secret of the namespace stays refused; a ConfigMap is a separate list
    other = {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "admin", "key": "k"}}}]}
    assert fields(other, allow) != []
    cm = {"env": [{"name": "T", "valueFrom": {"configMapKeyRef": {"name": "db", "key": "k"}}}]}
    assert fields(cm, allow) == ["spec.podTemplate.env[0].valueFrom.configMapKeyRef.name"]


@pytest.mark.parametrize(
    "value_from,field",
    [
        ({"fieldRef": {"fieldPath": "metadata.annotations['x']"}}, "fieldRef.fieldPath"),
        ({"fileKeyRef": {"path": "/etc/shadow", "volumeName": "v"}}, "fileKeyRef"),
        ({}, ""),
        (
            {
                "secretKeyRef": {"name": "db", "key": "k"},
                "configMapKeyRef": {"name": "c", "key": "k"},
            },
            "",
        ),
    ],
)
def test_env_value_from_other_sources_is_refused(value_from: dict, field: str) -> None:
    pt = {"env": [{"name": "X", "valueFrom": value_from}]}
    want = "spec.podTemplate.env[0].valueFrom" + (f".{field}" if field else "")
    assert want in fields(pt)


def test_env_value_from_the_pod_itself_is_allowed() -> None:
    pt = {
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "LIM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
        ]
    }
    assert fields(pt) == []


def test_env_from_needs_an_allowed_source_and_a_harmless_prefix() -> None:
    allow = pol.PodPolicy(default_resources=(), allowed_config_maps=("app",))
    ok = {"envFrom": [{"configMapRef": {"name": "app"}, "prefix": "APP_"}]}
    assert fields(ok, allow) == []
    assert fields(ok) == ["spec.podTemplate.envFrom[0].configMapRef.name"]
    for prefix in (None, "", "PY", "P", "LD_", "NPU_LORA_X", "H"):
        bad = {"envFrom": [{"configMapRef": {"name": "app"}, "prefix": prefix}]}
        assert fields(bad, allow) == ["spec.podTemplate.envFrom[0].prefix"], prefix
    sec = {"envFrom": [{"secretRef": {"name": "app"}, "prefix": "APP_"}]}
    assert fields(sec, allow) == ["spec.podTemplate.envFrom[0].secretRef.name"]


def test_env_from_reaches_the_container() -> None:
    r = run(podTemplate={"envFrom": [{"configMapRef": {"name": "app"}, "prefix": "APP_"}]})
    c = b.build_job(r, OperatorConfig(worker_image=WORKER, policy=FAST))["spec"]["template"]
    assert c["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": "app"}, "prefix": "APP_"}
    ]


def test_messages_never_quote_an_env_value() -> None:
    pt = {
        "env": [
            {"name": "PYTHONPATH", "value": SECRET},
            {"name": "OK", "value": SECRET, "valueFrom": {"secretKeyRef": {"name": "x"}}},
        ]
    }
    msg = messages(pt)
    assert SECRET not in msg and "spec.podTemplate.env[0].name" in msg


# --- volumes and mounts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        {"secret": {"secretName": "db"}},
        {"projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
        {"gitRepo": {"repository": "https://example.com/x.git"}},
        {"nfs": {"server": "10.0.0.1", "path": "/"}},
        {"iscsi": {"targetPortal": "1.2.3.4", "iqn": "x", "lun": 0}},
        {"csi": {"driver": "secrets-store.csi.k8s.io"}},
        {"ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        {"image": {"reference": "evil/tools:1"}},
        {"downwardAPI": {"items": []}},
        {"cephfs": {"monitors": ["m"]}},
        {"flexVolume": {"driver": "x"}},
        {"rbd": {"monitors": ["m"], "image": "i"}},
        {"awsElasticBlockStore": {"volumeID": "v"}},
        {"glusterfs": {"endpoints": "e", "path": "p"}},
        {"emptyDir": {}, "secret": {"secretName": "db"}},  # two sources
        {},  # none
    ],
)
def test_volume_types_outside_the_allow_list_are_refused(source: dict) -> None:
    pt = {"volumes": [{"name": "v", **source}]}
    found = fields(pt)
    assert found and all(f.startswith("spec.podTemplate.volumes[0]") for f in found)


def test_allowed_volume_types_mount_under_allowed_paths() -> None:
    pt = {
        "volumes": [
            {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            {"name": "ds", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
            {"name": "cfg", "configMap": {"name": "extra", "items": [{"key": "a", "path": "a"}]}},
        ],
        "volumeMounts": [
            {"name": "scratch", "mountPath": "/dev/shm"},
            {"name": "ds", "mountPath": "/data/sets", "subPath": "nsmc", "readOnly": True},
            {"name": "cfg", "mountPath": "/mnt/extra/cfg"},
        ],
    }
    assert fields(pt, pol.PodPolicy(default_resources=(), allowed_config_maps=("extra",))) == []


@pytest.mark.parametrize(
    "mount,field",
    [
        ({"subPath": "../../etc"}, "subPath"),
        ({"subPath": "a/../../b"}, "subPath"),
        ({"subPath": "/etc"}, "subPath"),
        ({"subPathExpr": "$(UP)/x"}, "subPathExpr"),  # UP = ".." below
        ({"subPathExpr": "$(FROM_SECRET)"}, "subPathExpr"),
        ({"mountPropagation": "Bidirectional"}, "mountPropagation"),
        ({"mountPropagation": "HostToContainer"}, "mountPropagation"),
        ({"mountPath": "/usr/lib/python3/dist-packages"}, "mountPath"),  # code over the image
        ({"mountPath": "/etc/npu-lora"}, "mountPath"),  # over the operator's config
        ({"mountPath": "/mnt/output/other"}, "mountPath"),
        ({"mountPath": "/mnt"}, "mountPath"),  # above the operator's mounts
        ({"mountPath": "/data/../etc"}, "mountPath"),
        ({"mountPath": "relative"}, "mountPath"),
        ({"name": "output"}, "name"),  # the operator's own output volume
        ({"name": "nope"}, "name"),
    ],
)
def test_hostile_mounts_are_refused(mount: dict, field: str) -> None:
    pt = {
        "env": [
            {"name": "UP", "value": ".."},
            {"name": "FROM_SECRET", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "volumes": [{"name": "h", "hostPath": {"path": "/srv/ok"}}],
        "volumeMounts": [{"name": "h", "mountPath": "/data/h", **mount}],
    }
    allow = pol.PodPolicy(default_resources=(), allowed_host_paths=("/srv/ok",))
    assert f"spec.podTemplate.volumeMounts[0].{field}" in fields(pt, allow)


def test_sub_path_of_the_spec_volumes_may_not_climb() -> None:
    # the schema refuses it first; the policy checks again (a spec from an older CRD)
    with pytest.raises(ValueError, match="subPath"):
        run(output={"volume": {"claimName": "runs", "subPath": "../../"}})
    r = run(output={"volume": {"claimName": "runs", "subPath": "ok"}})
    object.__setattr__(r.spec.output.volume, "sub_path", "a/../../etc")
    assert [v.field for v in pol.check_spec(r.spec, FAST, WORKER)] == ["spec.output.volume.subPath"]


def test_podtemplate_volume_names_may_not_shadow_the_operator_volumes() -> None:
    for name in sorted(pol.OPERATOR_VOLUMES):
        assert fields({"volumes": [{"name": name, "emptyDir": {"sizeLimit": "1Gi"}}]}) == [
            "spec.podTemplate.volumes[0].name"
        ]


# --- scheduling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tol",
    [
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
        {"key": "node-role.kubernetes.io/master", "effect": "NoSchedule", "operator": "Exists"},
        {"operator": "Exists"},  # tolerates every taint
        {"key": "", "operator": "Exists"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
        {"key": "furiosa.ai/rngd", "operator": "Bogus"},
    ],
)
def test_control_plane_and_wildcard_tolerations_are_refused(tol: dict) -> None:
    assert fields({"tolerations": [tol]})


def test_accelerator_tolerations_are_allowed_and_star_never_reaches_the_control_plane() -> None:
    assert fields({"tolerations": [{"key": "furiosa.ai/rngd", "operator": "Exists"}]}) == []
    star = pol.PodPolicy(default_resources=(), allowed_toleration_keys=("*",))
    cp = {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}
    assert fields(cp, star) != []
    exact = pol.PodPolicy(
        default_resources=(), allowed_toleration_keys=("node-role.kubernetes.io/control-plane",)
    )
    assert fields(cp, exact) == []


@pytest.mark.parametrize(
    "pt",
    [
        {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}},
        {"nodeSelector": {"kubernetes.io/hostname": "master-0"}},
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "node-role.kubernetes.io/control-plane",
                                        "operator": "Exists",
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
        },
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["cp"]}
                                ]
                            }
                        ]
                    }
                }
            }
        },
        {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "preference": {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "In"}
                                ]
                            },
                        }
                    ]
                }
            }
        },
        # co-locate with the apiserver's pods: lands on the control plane
        {
            "affinity": {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"component": "kube-apiserver"}},
                            "topologyKey": "kubernetes.io/hostname",
                            "namespaces": ["kube-system"],
                        }
                    ]
                }
            }
        },
        {"affinity": {"podAntiAffinity": {"x": [{"namespaceSelector": {}}]}}},
        {"priorityClassName": "system-node-critical"},
        {"priorityClassName": "system-cluster-critical"},
        {"priorityClassName": "batch"},  # no class is allowed by default
        {"imagePullSecrets": [{"name": "../x"}]},
    ],
)
def test_scheduling_onto_the_control_plane_or_above_others_is_refused(pt: dict) -> None:
    assert fields(pt), pt


def test_priority_classes_from_the_policy_but_system_only_when_exact() -> None:
    p = pol.PodPolicy(default_resources=(), allowed_priority_classes=("batch-*", "system-*"))
    assert fields({"priorityClassName": "batch-low"}, p) == []
    assert fields({"priorityClassName": "system-node-critical"}, p) != []
    exact = pol.PodPolicy(default_resources=(), allowed_priority_classes=("system-node-critical",))
    assert fields({"priorityClassName": "system-node-critical"}, exact) == []


def test_accelerator_node_selectors_are_allowed() -> None:
    pt = {"nodeSelector": {"furiosa.ai/model": "rngd", "topology.kubernetes.io/zone": "a"}}
    assert fields(pt) == []


def test_unknown_fields_in_free_form_objects_are_refused() -> None:
    assert fields({"env": [{"name": "A", "value": "b", "valueFromX": {}}]}) == [
        "spec.podTemplate.env[0].valueFromX"
    ]
    assert fields({"tolerations": [{"key": "furiosa.ai/rngd", "hostNetwork": True}]}) == [
        "spec.podTemplate.tolerations[0].hostNetwork"
    ]


def test_policy_reads_the_new_lists_from_chart_values() -> None:
    p = pol.PodPolicy.from_mapping(
        {
            "allowedSecrets": ["db"],
            "allowedConfigMaps": ["app"],
            "allowedTolerationKeys": ["gpu"],
            "allowedNodeSelectorKeys": [],
            "allowedPriorityClasses": ["batch"],
            "allowedMountPaths": ["/work"],
        }
    )
    assert p.allowed_secrets == ("db",) and p.allowed_mount_paths == ("/work",)
    assert p.allowed_node_selector_keys == ()
    with pytest.raises(ValueError, match="allowedMountPaths"):
        pol.PodPolicy.from_mapping({"allowedMountPaths": ["work"]})


def test_a_huge_image_is_quoted_short() -> None:
    r = run(image="x" * 500)
    ((v,),) = [pol.check_spec(r.spec, FAST, WORKER)]
    assert len(v.message) < 300 and "(500 characters)" in v.message


# --- the property -------------------------------------------------------------------------------

POLICY = pol.PodPolicy(
    default_resources=(),
    allowed_images=("reg/ok/*",),
    allowed_secrets=("db",),
    allowed_config_maps=("app",),
    allowed_host_paths=("/srv/ok",),
    allowed_priority_classes=("batch",),
    allowed_image_pull_secrets=("regcred",),
)
names = st.sampled_from(
    ["A", "OK_1", "x", "WANDB_MODE", "B", "PYTHONPATH", "HOME", "LD_PRELOAD", "NPU_LORA_X"]
)
refs = st.sampled_from(["db", "app", "db", "app", "admin", "kube-root-ca.crt", "../db"])
value_from = st.one_of(
    st.builds(lambda n: {"secretKeyRef": {"name": n, "key": "k"}}, refs),
    st.builds(lambda n: {"configMapKeyRef": {"name": n, "key": "k"}}, refs),
    st.just({"fieldRef": {"fieldPath": "metadata.name"}}),
    st.just({"fieldRef": {"fieldPath": "metadata.annotations"}}),
    st.just({"fileKeyRef": {"path": "p"}}),
)
env_item = st.one_of(
    st.builds(lambda n, v: {"name": n, "value": v}, names, st.text(max_size=5)),
    st.builds(lambda n, vf: {"name": n, "valueFrom": vf}, names, value_from),
)
sources = st.sampled_from(
    [
        {"emptyDir": {"sizeLimit": "1Gi"}},
        {"emptyDir": {}},
        {"emptyDir": {"medium": "Memory", "sizeLimit": "6Gi"}},
        {"emptyDir": {"sizeLimit": "20Gi"}},
        {"persistentVolumeClaim": {"claimName": "c1"}},
        {"configMap": {"name": "cm"}},
        {"configMap": {"name": "app"}},
        {"hostPath": {"path": "/srv/ok/a"}},
        {"hostPath": {"path": "/srv/ok/../../etc"}},
        {"hostPath": {"path": "/var/run/docker.sock"}},
        {"secret": {"secretName": "db"}},
        {"projected": {"sources": []}},
        {"nfs": {"server": "s", "path": "/"}},
        {"csi": {"driver": "d"}},
    ]
)
volume = st.builds(
    lambda n, s: {"name": n, **s}, st.sampled_from(["v1", "v2", "output", "config"]), sources
)
mount = st.builds(
    lambda n, p, sp: {"name": n, "mountPath": p, **({"subPath": sp} if sp else {})},
    st.sampled_from(["v1", "v2", "output"]),
    st.sampled_from(["/data/a", "/data/b", "/mnt/extra/x", "/etc/npu-lora", "/usr/lib"]),
    st.sampled_from([None, "a", None, "b/c", "../x", "/abs"]),
)
toleration = st.builds(
    lambda k, o: {"key": k, "operator": o} if k is not None else {"operator": o},
    st.sampled_from([None, "furiosa.ai/rngd", "node-role.kubernetes.io/control-plane", "x"]),
    st.sampled_from(["Exists", "Equal"]),
)
template = st.fixed_dictionaries(
    {},
    optional={
        "env": st.lists(env_item, max_size=4),
        "envFrom": st.lists(
            st.builds(
                lambda n, p: {"secretRef": {"name": n}, "prefix": p},
                refs,
                st.sampled_from(["APP_", "PY", "", "XDG_"]),
            ),
            max_size=2,
        ),
        "volumes": st.lists(volume, max_size=3, unique_by=lambda v: v["name"]),
        "volumeMounts": st.lists(mount, max_size=2, unique_by=lambda m: m["mountPath"]),
        "tolerations": st.lists(toleration, max_size=3),
        "priorityClassName": st.sampled_from(["batch", "system-node-critical", "other"]),
        "imagePullSecrets": st.lists(
            st.builds(lambda n: {"name": n}, st.sampled_from(["regcred", "db", "other", "x"])),
            max_size=2,
        ),
        "nodeSelector": st.dictionaries(
            st.sampled_from(["furiosa.ai/model", "node-role.kubernetes.io/master", "k"]),
            st.just("v"),
            max_size=2,
        ),
    },
)
image = st.sampled_from([None, "reg/ok/w:1", "evil/x:1", "reg/ok2/x:1"])


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pt=template, img=image)
def test_any_accepted_template_renders_only_allowed_things(pt: dict, img: str | None) -> None:
    spec: dict[str, Any] = {"podTemplate": pt}
    if img:
        spec["image"] = img
    try:
        r = run(**spec)
    except ValueError:
        return  # the schema refuses it before the policy
    if pol.check_spec(r.spec, POLICY, WORKER):
        return
    job = b.build_job(r, OperatorConfig(worker_image=WORKER, policy=POLICY))
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == WORKER or fnmatch.fnmatchcase(c["image"], "reg/ok/*")
    for v in pod["volumes"]:
        (kind,) = [k for k in v if k != "name"]
        assert kind in ("persistentVolumeClaim", "emptyDir", "configMap", "hostPath"), v
        if kind == "hostPath":
            assert under(v["hostPath"]["path"], ("/srv/ok",))
        if kind == "configMap" and v["name"] != "config":  # the operator's own
            assert v["configMap"]["name"] == "app", v
        if kind == "emptyDir" and v["name"] in {u["name"] for u in pt.get("volumes") or []}:
            assert v["emptyDir"].get("sizeLimit") in ("1Gi", "6Gi", "20Gi"), v
    tmpfs = sum(6 for v in pod["volumes"] if (v.get("emptyDir") or {}).get("medium") == "Memory")
    disk = sum(
        int(v["emptyDir"]["sizeLimit"][:-2])
        for v in pod["volumes"]
        if v["name"] in {u["name"] for u in pt.get("volumes") or []}
        and "emptyDir" in v
        and v["emptyDir"].get("medium") != "Memory"
    )
    assert tmpfs <= 8 and disk <= 32
    assert all(s["name"] == "regcred" for s in pod.get("imagePullSecrets") or [])
    names_ = [v["name"] for v in pod["volumes"]]
    assert len(names_) == len(set(names_))
    for m in c["volumeMounts"]:
        assert ".." not in str(m.get("subPath", "")).split("/")
        assert not str(m.get("subPath", "")).startswith("/")
        assert m.get("mountPropagation") in (None, "None")
    for e in c["env"]:
        vf = e.get("valueFrom") or {}
        if "secretKeyRef" in vf:
            assert vf["secretKeyRef"]["name"] == "db"
        if "configMapKeyRef" in vf:
            assert vf["configMapKeyRef"]["name"] == "app"
        assert set(vf) <= {"secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef"}
    user = {e["name"] for e in pt.get("env") or []}
    assert not any(pol.reserved_env(n) for n in user)
    for ef in c.get("envFrom") or []:
        assert ef["secretRef"]["name"] == "db" and not prefix_can_form_reserved(ef["prefix"])
    for t in pod.get("tolerations") or []:
        assert t.get("key") == "furiosa.ai/rngd"
    assert pod.get("priorityClassName") in (None, "batch")
    assert not any(k.startswith("node-role.") for k in pod.get("nodeSelector") or {})
