"""``spec.device.precompile``: the device graphs compiled by an Indexed Job before the training Job.

Pure functions (no I/O), torch-free (the plan is :mod:`npu_lora.compile.plan`):

- :func:`wants_precompile`: ``precompile`` resolved (``auto``: on for ``furiosa``) and possible
  (a ``compileCache`` volume to compile into);
- :func:`plan_size`: how many graphs the run's plan has (None when the operator cannot read the
  model's widths: a model given by path on a volume; then the Job cannot be sized here);
- :func:`build_precompile_job`: ``NAME-compile``, an Indexed Job with one index per graph of the
  plan (``completions = parallelism = total``, capped by ``max_parallel``), CPU only (no card
  request, no podTemplate nodeSelector: those pick card nodes), the shared cache volume
  (``compileCache``, a ReadWriteMany claim) and the model volume (the widths), running
  ``npu-lora precompile /etc/npu-lora/config.yaml`` (index from ``JOB_COMPLETION_INDEX``),
  annotated with the target product and compiler release its graphs' keys include
  (:func:`plan_identity`). An
  index whose graph is already in the cache exits at once (a hit): the operator cannot see the
  cache, so every graph gets an index and the pods skip what is there. A compile failure (exit
  1) fails the Job at once (``podFailurePolicy``) with the graph and the compiler's message in
  the pod's termination message;
- :func:`compile_status`: ``status.compile`` {done, total, etaSeconds, jobName} from the Job's
  status.

The handlers create this Job before the training Job and hold the latter back until it
completed (phase ``Compiling``, :func:`.status.compute_compile_status`): see docs/compile.md.
"""

from __future__ import annotations

from typing import Any

from npu_lora.api.v1alpha1 import EXIT_CONFIG_ERROR, GROUP

from npu_lora_operator.builders import (
    CACHE_ROOT,
    CACHE_VOLUME,
    CONFIG_DIR,
    CONFIG_PATH,
    CONTAINER_NAME,
    MODEL_MOUNT,
    RUN_NAME_ANNOTATION,
    TERMINATION_LOG,
    TMP_MOUNT,
    Body,
    Run,
    _child_meta,
    _pod_template,
    _short,
    _volume_source,
    build_children,
    cache_mount,
    configmap_name,
    container_security_context,
    graph_cache,
    labels,
    pod_security_context,
)
from npu_lora_operator.settings import OperatorConfig

COMPONENT = "precompile"
#: per compile pod: furiosa-torch's compiler is mostly single-threaded; the Qwen3 head/embed
#: graphs hold 151,936 × 2048 weights (1.2 GB in fp32) while compiling
RESOURCES: Body = {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "16Gi"}}
MAX_PARALLEL = 32


def precompile_job_name(name: str) -> str:
    return _short(name, "-compile", limit=52)


def wants_precompile(run: Run) -> bool:
    """``spec.device.precompile`` resolved, and a ``compileCache`` to compile into."""
    device = run.spec.device
    return device.precompile_enabled and device.compile_cache is not None


#: the precompile Job's annotations recording what its graphs are compiled for
TARGET_ANNOTATION = f"{GROUP}/compile-target"
COMPILER_ANNOTATION = f"{GROUP}/compiler"


def plan_identity(run: Run) -> dict[str, str]:
    """What the run's graphs compile for, as the precompile Job's annotations: the target
    (``<family>/<product>``, ``<family>/any`` without ``device.product``; backends without
    node facts: the backend) and the compiler release (:func:`npu_lora.compile.plan.compiler_id`,
    the worker image's pins where furiosa-torch is not installed). Both enter the graphs' keys."""
    from npu_lora.compile.plan import compile_target, compiler_id, resolve_backend

    backend = resolve_backend(run.spec)
    target = compile_target(run.spec, backend)
    where = f"{target['family']}/{target['product'] or 'any'}" if target else backend
    return {TARGET_ANNOTATION: where, COMPILER_ANNOTATION: compiler_id(backend)}


def plan_size(run: Run) -> int | None:
    """Graphs in the run's compile plan, or None when the model's widths are not readable here."""
    from npu_lora.compile.plan import compile_plan

    if not run.spec.model.preset:
        return None  # a model on a volume: its config.json is not visible to the operator
    try:
        return len(compile_plan(run.spec).entries)
    except (ValueError, OSError):
        return None


def build_precompile_job(
    run: Run, config: OperatorConfig, total: int, *, max_parallel: int = MAX_PARALLEL
) -> Body:
    """The Indexed Job compiling the run's ``total`` graphs (see the module doc)."""
    if total < 1:
        raise ValueError("a precompile Job needs at least one graph")
    spec = run.spec
    name = run.name
    pt = _pod_template(run)
    cache = spec.device.compile_cache
    if cache is None:
        raise ValueError("spec.device.precompile needs spec.device.compileCache (the shared cache)")
    vols: list[Body] = [
        {"name": "config", "configMap": {"name": configmap_name(name)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": config.tmp_size_limit}},
        {"name": CACHE_VOLUME, **_volume_source(cache, read_only=False, create=True)},
    ]
    cache_mnt: Body = {"name": CACHE_VOLUME, "mountPath": cache_mount(spec)}
    if cache.sub_path:
        cache_mnt["subPath"] = cache.sub_path
    mounts: list[Body] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": TMP_MOUNT},
        cache_mnt,
    ]
    if spec.model.volume is not None:  # the model's config.json (its widths)
        vols.append(
            {"name": "model", **_volume_source(spec.model.volume, read_only=True, create=False)}
        )
        m: Body = {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
        if spec.model.volume.sub_path:
            m["subPath"] = spec.model.volume.sub_path
        mounts.append(m)
    env = [
        {"name": "HOME", "value": TMP_MOUNT},
        {"name": "TMPDIR", "value": TMP_MOUNT},
        {"name": "XDG_CACHE_HOME", "value": CACHE_ROOT},
        {"name": "NPU_LORA_COMPILE_CACHE", "value": graph_cache(spec)},
        {"name": "NPU_LORA_TERMINATION_LOG", "value": TERMINATION_LOG},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    container: Body = {
        "name": CONTAINER_NAME,
        "image": spec.image or config.worker_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": [*config.worker_command, "precompile", CONFIG_PATH],
        "env": env,
        "volumeMounts": mounts,
        "resources": {k: dict(v) for k, v in RESOURCES.items()},  # CPU only: no card
        "securityContext": container_security_context(config),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: Body = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # compiles only; never talks to the API
        "enableServiceLinks": False,
        "securityContext": pod_security_context(config),
        "containers": [container],
        "volumes": vols,
    }
    for key in ("priorityClassName", "imagePullSecrets"):
        if pt.get(key):
            pod_spec[key] = pt[key]
    job_spec: Body = {
        "completionMode": "Indexed",
        "completions": total,
        "parallelism": min(total, max_parallel),
        "backoffLimit": total,  # a disrupted pod is retried; a compile error fails at once
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": CONTAINER_NAME,
                        "operator": "In",
                        "values": [1, EXIT_CONFIG_ERROR],
                    },
                },
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
            ]
        },
        "template": {
            "metadata": {
                "labels": labels(run, COMPONENT),
                "annotations": {
                    "kubectl.kubernetes.io/default-container": CONTAINER_NAME,
                    RUN_NAME_ANNOTATION: name,
                },
            },
            "spec": pod_spec,
        },
    }
    if spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    meta = _child_meta(run, precompile_job_name(name), COMPONENT)
    meta["annotations"] = {RUN_NAME_ANNOTATION: name, **plan_identity(run)}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}


def run_children(run: Run, config: OperatorConfig) -> tuple[list[Body], int | None]:
    """Every child the operator creates for ``run``, in creation order (the builders' children,
    with the precompile Job before the training Job when the run is precompiled), and the plan's
    size (None when not precompiled, or the plan cannot be sized here)."""
    children = build_children(run, config)
    total = plan_size(run) if wants_precompile(run) else None
    if total:  # the precompile Job goes before the training Job (the last child)
        children.insert(-1, build_precompile_job(run, config, total))
    return children, total


def compile_status(
    job_status: dict[str, Any] | None, total: int, elapsed_s: float | None, job_name: str
) -> dict[str, Any]:
    """``status.compile`` from the precompile Job's status: done = succeeded indexes; ETA from
    the rate so far (None before the first graph is done)."""
    st = job_status or {}
    done = min(int(st.get("succeeded") or 0), total)
    eta = None
    if done and elapsed_s is not None and done < total:
        eta = round(elapsed_s / done * (total - done), 1)
    elif done >= total:
        eta = 0.0
    return {"done": done, "total": total, "etaSeconds": eta, "jobName": job_name}
