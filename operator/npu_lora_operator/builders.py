"""Pure builders: MoEFinetune (a dict, as the apiserver returns it) → child objects (dicts).

No I/O here: every function takes the custom resource body and the :class:`OperatorConfig` and
returns plain ``dict`` manifests, so tests compare dicts. The children of a run ``NAME``:

- ConfigMap ``NAME-config``: ``config.yaml``, the resolved worker config (the MoEFinetune with
  volume paths rewritten to the fixed mount points and the volumes removed);
- ServiceAccount, Role and RoleBinding ``NAME-worker``: the worker may only ``get`` its own
  ``moefinetunes`` object and ``get``/``patch`` its ``moefinetunes/status``
  (``resourceNames: [NAME]``); skipped when ``podTemplate.serviceAccountName`` is set;
- Job ``NAME``: one run-and-exit pod (``restartPolicy: Never``).

All carry an ownerReference to the MoEFinetune (controller), so deleting the run deletes them.

Mount points (fixed, so the worker config is independent of the cluster's storage):
``/mnt/model``, ``/mnt/data``, ``/mnt/output``, ``/mnt/cache/furiosa`` (furiosa compile cache;
``XDG_CACHE_HOME=/mnt/cache``), ``/etc/npu-lora`` (the ConfigMap) and an ``emptyDir`` on ``/tmp``
(the root filesystem is read-only; ``HOME=/tmp``).
"""

from __future__ import annotations

import copy
import hashlib
import posixpath
from typing import Any

import yaml
from npu_lora.api.v1alpha1 import (
    API_VERSION,
    EXIT_CONFIG_ERROR,
    EXIT_NONFINITE_LOSS,
    GROUP,
    KIND,
    PLURAL,
)

from npu_lora_operator.settings import OperatorConfig

Body = dict[str, Any]

RUN_LABEL = f"{GROUP}/run"
#: the full run name (labels are cut to 63 characters; annotations are not)
RUN_NAME_ANNOTATION = f"{GROUP}/run-name"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
CONTAINER_NAME = "worker"
CONFIG_KEY = "config.yaml"
CONFIG_DIR = "/etc/npu-lora"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
MODEL_MOUNT = "/mnt/model"
DATA_MOUNT = "/mnt/data"
OUTPUT_MOUNT = "/mnt/output"
CACHE_ROOT = "/mnt/cache"
CACHE_MOUNT = f"{CACHE_ROOT}/furiosa"
TMP_MOUNT = "/tmp"
TERMINATION_LOG = "/dev/termination-log"
RNGD_RESOURCE = "furiosa.ai/rngd"
CUDA_RESOURCE = "nvidia.com/gpu"
MANAGED_BY = "npu-lora-operator"
ENV_NAME = "NPU_LORA_RESOURCE_NAME"
ENV_NAMESPACE = "NPU_LORA_RESOURCE_NAMESPACE"
ENV_UID = "NPU_LORA_RESOURCE_UID"

_MAX_NAME = 63  # DNS label (Job names feed the pods' job-name label)


def _short(name: str, suffix: str = "", limit: int = _MAX_NAME) -> str:
    """``name + suffix`` cut to ``limit`` characters with a stable hash when too long."""
    full = name + suffix
    if len(full) <= limit:
        return full
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    keep = limit - len(suffix) - len(digest) - 1
    return f"{name[:keep].rstrip('-.')}-{digest}{suffix}"


def run_label_value(name: str) -> str:
    """Label value identifying a run's objects (label values are at most 63 characters)."""
    return _short(name)


def job_name(name: str) -> str:
    # pods are named <job>-<5 chars>; keep the job name at most 52 characters like CronJobs do
    return _short(name, limit=52)


def configmap_name(name: str) -> str:
    return _short(name, "-config", limit=253)


def worker_sa_name(name: str) -> str:
    return _short(name, "-worker", limit=253)


def _meta(body: Body) -> Body:
    return body.get("metadata") or {}


def _spec(body: Body) -> Body:
    return body.get("spec") or {}


def owner_reference(body: Body) -> Body:
    """The controller ownerReference pointing at the MoEFinetune."""
    meta = _meta(body)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(body: Body, component: str = "worker") -> dict[str, str]:
    name = _meta(body)["name"]
    out = {
        "app.kubernetes.io/name": "npu-lora",
        "app.kubernetes.io/instance": run_label_value(name),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "npu-lora",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        RUN_LABEL: run_label_value(name),
    }
    return out


def _child_meta(body: Body, name: str, component: str = "worker") -> Body:
    meta = _meta(body)
    return {
        "name": name,
        "namespace": meta.get("namespace"),
        "labels": labels(body, component),
        "ownerReferences": [owner_reference(body)],
    }


# ---------------------------------------------------------------------------------------------
# paths and volumes


def _join(root: str, rel: str | None) -> str:
    """``root/rel``, never outside ``root`` (``..`` cannot climb above the mount point)."""
    if not rel:
        return root
    inner = posixpath.normpath("/" + rel)  # "/../x" -> "/x"
    return root if inner == "/" else posixpath.normpath(root + inner)


def output_path(body: Body) -> str:
    """The run directory inside the worker container (``/mnt/output/<path or name>``)."""
    out = _spec(body).get("output") or {}
    return _join(OUTPUT_MOUNT, out.get("path") or _meta(body)["name"])


def _volume_source(ref: Body, *, read_only: bool, create: bool) -> Body:
    if ref.get("claimName"):
        return {"persistentVolumeClaim": {"claimName": ref["claimName"], "readOnly": read_only}}
    return {
        "hostPath": {
            "path": ref["hostPath"],
            "type": "DirectoryOrCreate" if create else "Directory",
        }
    }


def _volumes(body: Body, config: OperatorConfig) -> tuple[list[Body], list[Body]]:
    """(pod volumes, container volumeMounts) for model, data, output, cache, config and /tmp."""
    spec = _spec(body)
    name = _meta(body)["name"]
    vols: list[Body] = [
        {"name": "config", "configMap": {"name": configmap_name(name)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": config.tmp_size_limit}},
    ]
    mounts: list[Body] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": TMP_MOUNT},
    ]
    refs: list[tuple[str, Body | None, str, bool, bool]] = [
        ("model", (spec.get("model") or {}).get("volume"), MODEL_MOUNT, True, False),
        ("data", (spec.get("data") or {}).get("volume"), DATA_MOUNT, True, False),
        ("output", (spec.get("output") or {}).get("volume"), OUTPUT_MOUNT, False, True),
        ("furiosa-cache", (spec.get("device") or {}).get("compileCache"), CACHE_MOUNT, False, True),
    ]
    for vol_name, ref, mount, default_ro, create in refs:
        if ref:
            read_only = ref.get("readOnly")
            read_only = default_ro if read_only is None else bool(read_only)
            vols.append(
                {"name": vol_name, **_volume_source(ref, read_only=read_only, create=create)}
            )
            m: Body = {"name": vol_name, "mountPath": mount}
            if read_only:
                m["readOnly"] = True
            if ref.get("subPath"):
                m["subPath"] = ref["subPath"]
            mounts.append(m)
        elif vol_name == "output":
            # no volume: the run directory still needs a writable place (lost with the pod)
            vols.append({"name": vol_name, "emptyDir": {}})
            mounts.append({"name": vol_name, "mountPath": mount})
    return vols, mounts


# ---------------------------------------------------------------------------------------------
# worker config (ConfigMap)


def worker_config(body: Body) -> Body:
    """The manifest the worker runs: paths under the mount points, no volumes, no status."""
    meta = _meta(body)
    spec = copy.deepcopy(_spec(body))
    model = spec.get("model") or {}
    if model.pop("volume", None) is not None:
        model["path"] = _join(MODEL_MOUNT, model.get("path"))
        if model.get("tokenizer"):
            model["tokenizer"] = _join(MODEL_MOUNT, model["tokenizer"])
    data = spec.get("data") or {}
    if data.pop("volume", None) is not None and not str(data.get("path", "")).startswith(
        "example:"
    ):
        data["path"] = _join(DATA_MOUNT, data.get("path"))
    device = spec.get("device")
    if isinstance(device, dict):
        device.pop("compileCache", None)
    output = spec.setdefault("output", {})
    output.pop("volume", None)
    output["path"] = output_path(body)
    # cluster-only fields mean nothing to `npu-lora run`; keep the worker config minimal
    for key in (
        "image",
        "resources",
        "suspend",
        "backoffLimit",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
        "queueName",
        "podTemplate",
    ):
        spec.pop(key, None)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
        "spec": spec,
    }


def build_configmap(body: Body) -> Body:
    text = yaml.safe_dump(worker_config(body), sort_keys=False, allow_unicode=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _child_meta(body, configmap_name(_meta(body)["name"])),
        "data": {CONFIG_KEY: text},
    }


# ---------------------------------------------------------------------------------------------
# RBAC


def uses_own_service_account(body: Body) -> bool:
    """False when the user names a ServiceAccount in ``podTemplate`` (no per-run RBAC then)."""
    return not ((_spec(body).get("podTemplate") or {}).get("serviceAccountName"))


def build_service_account(body: Body) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _child_meta(body, worker_sa_name(_meta(body)["name"])),
        "automountServiceAccountToken": True,
    }


def build_role(body: Body) -> Body:
    name = _meta(body)["name"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _child_meta(body, worker_sa_name(name)),
        "rules": [
            {
                "apiGroups": [GROUP],
                "resources": [f"{PLURAL}/status"],
                "resourceNames": [name],
                "verbs": ["get", "patch"],
            },
            {
                "apiGroups": [GROUP],
                "resources": [PLURAL],
                "resourceNames": [name],
                "verbs": ["get"],
            },
        ],
    }


def build_role_binding(body: Body) -> Body:
    meta = _meta(body)
    sa = worker_sa_name(meta["name"])
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _child_meta(body, sa),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": meta.get("namespace")}],
    }


# ---------------------------------------------------------------------------------------------
# Job


def accelerator_resources(body: Body) -> dict[str, int]:
    """The extended-resource request of the worker: RNGD cards, or GPUs for ``cuda``."""
    device = _spec(body).get("device") or {}
    backend = device.get("backend", "auto")
    cards = int(device.get("cards", 1))
    if cards <= 0:
        return {}
    if backend in ("furiosa", "auto"):
        return {RNGD_RESOURCE: cards}
    if backend == "cuda":
        return {CUDA_RESOURCE: cards}
    return {}


def _resources(body: Body) -> Body:
    res = copy.deepcopy(_spec(body).get("resources") or {})
    accel = accelerator_resources(body)
    if accel:
        # extended resources: requests must equal limits
        res.setdefault("requests", {}).update({k: str(v) for k, v in accel.items()})
        res.setdefault("limits", {}).update({k: str(v) for k, v in accel.items()})
    for key in ("requests", "limits"):
        if key in res:
            res[key] = {k: (v if isinstance(v, str) else str(v)) for k, v in res[key].items()}
            if not res[key]:
                del res[key]
    return res


def pod_security_context(config: OperatorConfig) -> Body:
    return {
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
        "runAsGroup": config.run_as_user,
        "fsGroup": config.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(config: OperatorConfig) -> Body:
    return {
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_failure_policy() -> Body:
    """Disruptions (preemption, eviction, node drain) do not count against ``backoffLimit``;
    a config error or a non-finite loss fails the Job at once (a retry cannot help)."""
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER_NAME,
                    "operator": "In",
                    "values": [EXIT_CONFIG_ERROR, EXIT_NONFINITE_LOSS],
                },
            },
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        ]
    }


def worker_command(body: Body, config: OperatorConfig) -> list[str]:
    return [*config.worker_command, "run", CONFIG_PATH, "--out", output_path(body)]


def worker_env(body: Body, config: OperatorConfig) -> list[Body]:
    meta = _meta(body)
    env: list[Body] = [
        {"name": ENV_NAME, "value": meta["name"]},
        {"name": ENV_NAMESPACE, "value": meta.get("namespace") or "default"},
        {"name": ENV_UID, "value": meta.get("uid", "")},
        {"name": "HOME", "value": TMP_MOUNT},
        {"name": "XDG_CACHE_HOME", "value": CACHE_ROOT if _has_cache(body) else "/tmp/.cache"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # the worker writes its summary / error there (the kubelet reads it back)
        {"name": "NPU_LORA_TERMINATION_LOG", "value": TERMINATION_LOG},
    ]
    if (_spec(body).get("data") or {}).get("volume"):
        # the worker reads data only under the data volume (no symlink or path escapes it)
        env.append({"name": "NPU_LORA_DATA_ROOT", "value": DATA_MOUNT})
    env += [{"name": k, "value": v} for k, v in config.extra_env]
    user = (_spec(body).get("podTemplate") or {}).get("env") or []
    names = {e.get("name") for e in user}
    env = [e for e in env if e["name"] not in names or e["name"].startswith("NPU_LORA_RESOURCE")]
    env += [
        copy.deepcopy(e) for e in user if not str(e.get("name", "")).startswith("NPU_LORA_RESOURCE")
    ]
    return env


def _has_cache(body: Body) -> bool:
    return bool((_spec(body).get("device") or {}).get("compileCache"))


def build_job(body: Body, config: OperatorConfig) -> Body:
    """The run's ``batch/v1`` Job (DESIGN §3)."""
    meta = _meta(body)
    spec = _spec(body)
    name = meta["name"]
    pt = spec.get("podTemplate") or {}
    vols, mounts = _volumes(body, config)
    vols += copy.deepcopy(pt.get("volumes") or [])
    mounts += copy.deepcopy(pt.get("volumeMounts") or [])

    container: Body = {
        "name": CONTAINER_NAME,
        "image": spec.get("image") or config.worker_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": worker_command(body, config),
        "env": worker_env(body, config),
        "volumeMounts": mounts,
        "securityContext": container_security_context(config),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    res = _resources(body)
    if res:
        container["resources"] = res

    pod_labels = labels(body)
    pod_spec: Body = {
        "restartPolicy": "Never",
        "serviceAccountName": pt.get("serviceAccountName") or worker_sa_name(name),
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(config),
        "containers": [container],
        "volumes": vols,
    }
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets"):
        if pt.get(key):
            pod_spec[key] = copy.deepcopy(pt[key])

    job_labels = labels(body)
    if spec.get("queueName"):
        job_labels[QUEUE_LABEL] = spec["queueName"]
    job_spec: Body = {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": int(spec.get("backoffLimit", 2)),
        "podFailurePolicy": pod_failure_policy(),
        # Kueue admits a queued Job by un-suspending it: create it suspended
        "suspend": bool(spec.get("suspend", False)) or bool(spec.get("queueName")),
        "template": {
            "metadata": {
                "labels": pod_labels,
                "annotations": {
                    "kubectl.kubernetes.io/default-container": CONTAINER_NAME,
                    RUN_NAME_ANNOTATION: name,
                },
            },
            "spec": pod_spec,
        },
    }
    if spec.get("activeDeadlineSeconds") is not None:
        job_spec["activeDeadlineSeconds"] = int(spec["activeDeadlineSeconds"])
    if spec.get("ttlSecondsAfterFinished") is not None:
        job_spec["ttlSecondsAfterFinished"] = int(spec["ttlSecondsAfterFinished"])
    job_meta = _child_meta(body, job_name(name))
    job_meta["labels"] = job_labels
    job_meta["annotations"] = {RUN_NAME_ANNOTATION: name}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": job_spec}


def build_children(body: Body, config: OperatorConfig) -> list[Body]:
    """Every child of the run, in creation order (the Job last, when its inputs exist)."""
    out = [build_configmap(body)]
    if uses_own_service_account(body):
        out += [build_service_account(body), build_role(body), build_role_binding(body)]
    out.append(build_job(body, config))
    return out
