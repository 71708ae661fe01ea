"""Pure builders: a MoEFinetune (typed: :class:`Run`) → child objects (dicts).

No I/O here: every function takes a :class:`Run` (the run's name, namespace, uid and its typed
:class:`~npu_lora.api.v1alpha1.MoEFinetuneSpec`, parsed once from the body the apiserver sends)
and the :class:`OperatorConfig`, and returns plain ``dict`` manifests, so tests compare dicts.
The children of a run ``NAME``:

- ConfigMap ``NAME-config``: ``config.yaml``, the resolved worker config (the MoEFinetune with
  volume paths rewritten to the fixed mount points and the volumes removed, except
  ``device.compileCache`` with ``precompile: true``, which requires it);
- ServiceAccount, Role and RoleBinding ``NAME-worker``: the worker may only ``get`` its own
  ``moefinetunes`` object and ``get``/``patch`` its ``moefinetunes/status``
  (``resourceNames: [NAME]``); skipped when ``podTemplate.serviceAccountName`` is set;
- Job ``NAME``: one run-and-exit pod (``restartPolicy: Never``);
- data parallel with ``spec.distributed.workers > 1``: the Job is Indexed (``completionMode:
  Indexed``, ``completions = parallelism = workers``; pod ``i`` is worker ``i``, node rank
  ``JOB_COMPLETION_INDEX``) and a headless Service ``NAME-dp`` (:func:`build_service`) gives
  pod 0 the stable name ``<job>-0.<service>``: the rendezvous address (``MASTER_ADDR``).

All carry an ownerReference to the MoEFinetune (controller), so deleting the run deletes them.

Mount points (fixed, so the worker config is independent of the cluster's storage):
``/mnt/model``, ``/mnt/data``, ``/mnt/output``, ``/mnt/cache/<folder>`` (the compile cache, the
backend's registry ``cache_folder``: ``furiosa`` for RNGD; ``XDG_CACHE_HOME=/mnt/cache``), ``/etc/npu-lora`` (the ConfigMap) and an ``emptyDir`` on ``/tmp``
(the root filesystem is read-only; ``HOME=/tmp``).
"""

from __future__ import annotations

import copy
import hashlib
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from npu_lora.api import backends as registry
from npu_lora.api.v1alpha1 import (
    API_VERSION,
    ENV_NAME,
    ENV_NAMESPACE,
    ENV_UID,
    EXIT_CONFIG_ERROR,
    EXIT_NONFINITE_LOSS,
    EXIT_RENDEZVOUS_TIMEOUT,
    GROUP,
    KIND,
    PLURAL,
    MoEFinetuneSpec,
    VolumeRef,
    spec_fields,
)

from npu_lora_operator.policy import default_resources
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
#: the compile cache volume's name in the pods
CACHE_VOLUME = "compile-cache"
TMP_MOUNT = "/tmp"
TERMINATION_LOG = "/dev/termination-log"
MANAGED_BY = "npu-lora-operator"

_MAX_NAME = 63  # DNS label (Job names feed the pods' job-name label)


def cache_mount(spec: Any) -> str:
    """Where the compile cache volume is mounted: ``$XDG_CACHE_HOME/<folder>``, the backend's
    registry ``cache_folder`` (``/mnt/cache/furiosa`` for RNGD, where furiosa-torch keeps its
    own cache; ``auto`` resolves as the cluster would)."""
    folder = registry.resolve(spec.device.backend, spec.device.cards).cache_dir
    return f"{CACHE_ROOT}/{folder}"


def graph_cache(spec: Any) -> str:
    """The graph cache inside the compile cache volume (the worker's ``cache_root`` of a spec
    with ``compileCache``: ``$XDG_CACHE_HOME/<folder>/npu-lora``, ``compile.cache.GRAPH_DIR``)."""
    return f"{cache_mount(spec)}/npu-lora"


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


def service_name(name: str) -> str:
    """The headless Service of a multi-worker run (a DNS-1035 label: starts with a letter)."""
    base = name if name[:1].isalpha() else f"r-{name}"
    return _short(base, "-dp")


@dataclass(frozen=True)
class Run:
    """One MoEFinetune as the builders see it: its identity and its typed spec."""

    name: str
    namespace: str | None
    uid: str
    spec: MoEFinetuneSpec

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Run:
        """Parse the body the apiserver sends (raises pydantic's ``ValidationError``, a
        ``ValueError``, naming the field, when the spec is invalid)."""
        meta = body.get("metadata") or {}
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace"),
            uid=meta.get("uid", ""),
            spec=MoEFinetuneSpec.model_validate(body.get("spec") or {}),
        )


def owner_reference(run: Run) -> Body:
    """The controller ownerReference pointing at the MoEFinetune."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": run.name,
        "uid": run.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(run: Run, component: str = "worker") -> dict[str, str]:
    name = run.name
    out = {
        "app.kubernetes.io/name": "npu-lora",
        "app.kubernetes.io/instance": run_label_value(name),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "npu-lora",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        RUN_LABEL: run_label_value(name),
    }
    return out


def _child_meta(run: Run, name: str, component: str = "worker") -> Body:
    return {
        "name": name,
        "namespace": run.namespace,
        "labels": labels(run, component),
        "ownerReferences": [owner_reference(run)],
    }


# ---------------------------------------------------------------------------------------------
# paths and volumes


def _join(root: str, rel: str | None) -> str:
    """``root/rel``, never outside ``root`` (``..`` cannot climb above the mount point)."""
    if not rel:
        return root
    inner = posixpath.normpath("/" + rel)  # "/../x" -> "/x"
    return root if inner == "/" else posixpath.normpath(root + inner)


def output_path(run: Run) -> str:
    """The run directory inside the worker container (``/mnt/output/<path or name>``)."""
    return _join(OUTPUT_MOUNT, run.spec.output.path or run.name)


def _volume_source(ref: VolumeRef, *, read_only: bool, create: bool) -> Body:
    if ref.claim_name:
        return {"persistentVolumeClaim": {"claimName": ref.claim_name, "readOnly": read_only}}
    return {
        "hostPath": {
            "path": ref.host_path,
            "type": "DirectoryOrCreate" if create else "Directory",
        }
    }


def _volumes(run: Run, config: OperatorConfig) -> tuple[list[Body], list[Body]]:
    """(pod volumes, container volumeMounts) for model, data, output, cache, config and /tmp."""
    spec = run.spec
    name = run.name
    vols: list[Body] = [
        {"name": "config", "configMap": {"name": configmap_name(name)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": config.tmp_size_limit}},
    ]
    mounts: list[Body] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": TMP_MOUNT},
    ]
    refs: list[tuple[str, VolumeRef | None, str, bool, bool]] = [
        ("model", spec.model.volume, MODEL_MOUNT, True, False),
        ("data", spec.data.volume, DATA_MOUNT, True, False),
        ("output", spec.output.volume, OUTPUT_MOUNT, False, True),
        (CACHE_VOLUME, spec.device.compile_cache, cache_mount(spec), False, True),
    ]
    for vol_name, ref, mount, default_ro, create in refs:
        if ref:
            read_only = default_ro if ref.read_only is None else ref.read_only
            vols.append(
                {"name": vol_name, **_volume_source(ref, read_only=read_only, create=create)}
            )
            m: Body = {"name": vol_name, "mountPath": mount}
            if read_only:
                m["readOnly"] = True
            if ref.sub_path:
                m["subPath"] = ref.sub_path
            mounts.append(m)
        elif vol_name == "output":
            # no volume: the run directory still needs a writable place (lost with the pod)
            vols.append({"name": vol_name, "emptyDir": {}})
            mounts.append({"name": vol_name, "mountPath": mount})
    return vols, mounts


# ---------------------------------------------------------------------------------------------
# worker config (ConfigMap)


def worker_config(run: Run) -> Body:
    """The manifest the worker runs: paths under the mount points, no volumes (but the compile
    cache's reference with ``precompile: true``), no status, no cluster-only field; the fields
    set in the MoEFinetune only (the worker fills defaults)."""
    spec = run.spec.model_dump(mode="json", by_alias=True, exclude_unset=True)
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
    if isinstance(device, dict) and device.get("precompile") is not True:
        # the worker finds the cache at NPU_LORA_COMPILE_CACHE (the mount point); the
        # reference stays with `precompile: true`, which requires it
        device.pop("compileCache", None)
    output = spec.setdefault("output", {})
    output.pop("volume", None)
    output["path"] = output_path(run)
    # cluster-only fields mean nothing to `npu-lora run`; keep the worker config minimal
    for key in spec_fields(cluster_only=True):
        spec.pop(key, None)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": run.name, "namespace": run.namespace},
        "spec": spec,
    }


def build_configmap(run: Run) -> Body:
    text = yaml.safe_dump(worker_config(run), sort_keys=False, allow_unicode=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _child_meta(run, configmap_name(run.name)),
        "data": {CONFIG_KEY: text},
    }


# ---------------------------------------------------------------------------------------------
# RBAC


def uses_own_service_account(run: Run) -> bool:
    """False when the user names a ServiceAccount in ``podTemplate`` (no per-run RBAC then)."""
    pt = run.spec.pod_template
    return not (pt is not None and pt.service_account_name)


def build_service_account(run: Run) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _child_meta(run, worker_sa_name(run.name)),
        "automountServiceAccountToken": True,
    }


def build_role(run: Run) -> Body:
    name = run.name
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _child_meta(run, worker_sa_name(name)),
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


def build_role_binding(run: Run) -> Body:
    sa = worker_sa_name(run.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _child_meta(run, sa),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": run.namespace}],
    }


# ---------------------------------------------------------------------------------------------
# Job


def accelerator_resources(run: Run) -> dict[str, int]:
    """The extended-resource request of the worker: RNGD cards, or GPUs for ``cuda``; with
    ``device.partition`` that many partitions of cards instead (the registry's resource name)."""
    backend = run.spec.device.backend
    cards = run.spec.device.cards
    if cards <= 0:
        return {}
    node = run.spec.device.node_backend
    if run.spec.device.partition is not None and node is not None:
        return {node.partition_resource(run.spec.device.partition): cards}
    resource = (  # auto with cards: the first accelerator's (furiosa)
        registry.card_resource() if backend == registry.AUTO else registry.entry(backend).resource
    )
    return {resource: cards} if resource else {}


def node_requirements(run: Run) -> list[Body]:
    """The node-selector requirements of a card run: the backend's family label always, the
    product label with ``device.product`` (the registry's names, :class:`NodeFacts`)."""
    device = run.spec.device
    node = device.node_backend
    if node is None or device.cards <= 0 or node.node is None:
        return []
    facts = node.node
    out: list[Body] = [{"key": facts.family_label, "operator": "In", "values": [facts.family]}]
    if device.product is not None:
        out.append({"key": facts.product_label, "operator": "In", "values": [device.product]})
    return out


def node_affinity(run: Run, affinity: Body | None) -> Body | None:
    """``affinity`` (the podTemplate's) with :func:`node_requirements` added to every required
    node-selector term (terms are ORed, so each must carry them), or a term of its own."""
    reqs = node_requirements(run)
    if not reqs:
        return affinity
    out = copy.deepcopy(affinity) if affinity else {}
    node_aff = out.setdefault("nodeAffinity", {})
    required = node_aff.setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
    )
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or []), *reqs]
    return out


def _resources(run: Run, config: OperatorConfig) -> Body:
    res = run.spec.resources.to_api() if run.spec.resources is not None else {}
    # CPU/memory the spec leaves unset: the admission policy's defaults (memory from the model)
    res = default_resources(run.spec, res, config.policy)
    accel = accelerator_resources(run)
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


def pod_failure_policy(distributed: bool = False) -> Body:
    """Disruptions (preemption, eviction, node drain) do not count against ``backoffLimit``;
    a config error or a non-finite loss fails the Job at once (a retry cannot help); with more
    than one rank so does a rendezvous timeout (a rank never came up)."""
    codes = [EXIT_CONFIG_ERROR, EXIT_NONFINITE_LOSS]
    if distributed:
        codes.append(EXIT_RENDEZVOUS_TIMEOUT)
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER_NAME,
                    "operator": "In",
                    "values": codes,
                },
            },
            # `status` explicitly: the apiserver defaults it on create, but the published
            # schemas before 1.34 mark it required (kubernetes/kubernetes#131512)
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
        ]
    }


def literal_arg(text: str) -> str:
    """``text`` as a container argument the kubelet passes verbatim: it expands ``$(VAR)`` in
    ``command``/``args`` from the container's env, so an ``output.path`` of ``$(APP_TOKEN)``
    would otherwise put a Secret's value (or ``..``) into the run directory; ``$$`` is a
    literal ``$``."""
    return text.replace("$", "$$")


def worker_command(run: Run, config: OperatorConfig) -> list[str]:
    return [*config.worker_command, "run", CONFIG_PATH, "--out", literal_arg(output_path(run))]


def _pod_template(run: Run) -> Body:
    """``spec.podTemplate`` as API keys (a copy; empty when unset)."""
    pt = run.spec.pod_template
    return pt.to_api() if pt is not None else {}


def worker_env(run: Run, config: OperatorConfig) -> list[Body]:
    has_cache = run.spec.device.compile_cache is not None
    env: list[Body] = [
        {"name": ENV_NAME, "value": run.name},
        {"name": ENV_NAMESPACE, "value": run.namespace or "default"},
        {"name": ENV_UID, "value": run.uid},
        {"name": "HOME", "value": TMP_MOUNT},
        {"name": "XDG_CACHE_HOME", "value": CACHE_ROOT if has_cache else "/tmp/.cache"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # the worker writes its summary / error there (the kubelet reads it back)
        {"name": "NPU_LORA_TERMINATION_LOG", "value": TERMINATION_LOG},
    ]
    if run.spec.data.volume is not None:
        # the worker reads data only under the data volume (no symlink or path escapes it)
        env.append({"name": "NPU_LORA_DATA_ROOT", "value": DATA_MOUNT})
    if has_cache:  # the graph cache (npu_lora.compile.cache): the worker checks its plan there
        env.append({"name": "NPU_LORA_COMPILE_CACHE", "value": graph_cache(run.spec)})
    env += [{"name": k, "value": v} for k, v in config.extra_env]
    user = _pod_template(run).get("env") or []
    names = {e.get("name") for e in user}
    env = [e for e in env if e["name"] not in names or e["name"].startswith("NPU_LORA_RESOURCE")]
    env += [e for e in user if not str(e.get("name", "")).startswith("NPU_LORA_RESOURCE")]
    return env


def world_size(run: Run) -> int:
    """Training ranks of the run (1 without ``spec.distributed``)."""
    d = run.spec.distributed
    return d.world_size(run.spec.device.cards) if d is not None else 1


def workers(run: Run) -> int:
    d = run.spec.distributed
    return d.workers if d is not None else 1


def distributed_env(run: Run) -> list[Body]:
    """The rendezvous of a multi-worker run: pod 0 through the headless Service. The node rank
    is the pod's ``JOB_COMPLETION_INDEX`` (set by Kubernetes in Indexed Jobs)."""
    d = run.spec.distributed
    assert d is not None
    return [
        {"name": "MASTER_ADDR", "value": f"{job_name(run.name)}-0.{service_name(run.name)}"},
        {"name": "MASTER_PORT", "value": str(d.port)},
        {"name": "WORLD_SIZE", "value": str(world_size(run))},
    ]


def build_service(run: Run) -> Body:
    """Headless Service of a multi-worker run: DNS names ``<job>-<index>.<service>`` for its
    pods (published before they are ready, so rank 0 is reachable while it waits)."""
    d = run.spec.distributed
    assert d is not None
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _child_meta(run, service_name(run.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {RUN_LABEL: run_label_value(run.name)},
            "ports": [
                {"name": "rendezvous", "port": d.port, "targetPort": d.port, "protocol": "TCP"}
            ],
        },
    }


def build_job(run: Run, config: OperatorConfig) -> Body:
    """The run's ``batch/v1`` Job (Indexed with several workers)."""
    spec = run.spec
    name = run.name
    pt = _pod_template(run)
    vols, mounts = _volumes(run, config)
    vols += pt.get("volumes") or []
    mounts += pt.get("volumeMounts") or []

    container: Body = {
        "name": CONTAINER_NAME,
        "image": spec.image or config.worker_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": worker_command(run, config),
        "env": worker_env(run, config),
        "volumeMounts": mounts,
        "securityContext": container_security_context(config),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if pt.get("envFrom"):
        container["envFrom"] = pt["envFrom"]
    res = _resources(run, config)
    if res:
        container["resources"] = res

    pod_labels = labels(run)
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
            pod_spec[key] = pt[key]
    affinity = node_affinity(run, pt.get("affinity"))
    if affinity:
        pod_spec["affinity"] = affinity

    job_labels = labels(run)
    if spec.queue_name:
        job_labels[QUEUE_LABEL] = spec.queue_name
    n_workers = workers(run)
    if n_workers > 1:
        container["env"] = [*container["env"], *distributed_env(run)]
        pod_spec["subdomain"] = service_name(name)
    job_spec: Body = {
        "parallelism": n_workers,
        "completions": n_workers,
        # one failed rank fails every rank's collective: count a whole round of failures
        "backoffLimit": spec.backoff_limit * n_workers,
        "podFailurePolicy": pod_failure_policy(world_size(run) > 1),
        # Kueue admits a queued Job by un-suspending it: create it suspended
        "suspend": spec.suspend or bool(spec.queue_name),
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
    if n_workers > 1:
        job_spec["completionMode"] = "Indexed"
    if spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    job_meta = _child_meta(run, job_name(name))
    job_meta["labels"] = job_labels
    job_meta["annotations"] = {RUN_NAME_ANNOTATION: name}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": job_spec}


def build_children(run: Run, config: OperatorConfig) -> list[Body]:
    """Every child of the run, in creation order (the Job last, when its inputs exist)."""
    out = [build_configmap(run)]
    if uses_own_service_account(run):
        out += [build_service_account(run), build_role(run), build_role_binding(run)]
    if workers(run) > 1:
        out.append(build_service(run))
    out.append(build_job(run, config))
    return out
