"""A run's violations: its spec, its podTemplate and the pods built for it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from npu_lora_operator.messages import quote
from npu_lora_operator.policy.common import allowed_text, check_sub_path, matches, under
from npu_lora_operator.policy.config import AUTO, Body, PodPolicy, Violation
from npu_lora_operator.policy.env import check_env, check_env_from
from npu_lora_operator.policy.images import check_image, check_pull_secrets
from npu_lora_operator.policy.paths import check_paths
from npu_lora_operator.policy.privileged import check_pod_spec
from npu_lora_operator.policy.quantities import quantity_bytes
from npu_lora_operator.policy.scheduling import (
    check_affinity,
    check_node_selector,
    check_priority_class,
    check_tolerations,
)
from npu_lora_operator.policy.volumes import (
    check_mounts,
    check_volumes,
    host_paths,
    memory_volume_bytes,
    volume_refs,
)


def check_spec(
    spec: Any, policy: PodPolicy, worker_image: str, operator_env: Iterable[str] = ()
) -> list[Violation]:
    """The violations of a :class:`~npu_lora.api.v1alpha1.MoEFinetuneSpec` (empty: allowed).
    ``operator_env``: names the operator's own configuration sets in the worker (reserved too)."""
    out = check_image(spec.image, policy, worker_image)
    out += check_paths(spec)
    pt = spec.pod_template
    sa = pt.service_account_name if pt is not None else None
    if sa and not matches(sa, policy.allowed_service_accounts):
        allowed = allowed_text(policy.allowed_service_accounts, "serviceAccountName")
        out.append(
            Violation(
                "spec.podTemplate.serviceAccountName",
                f"ServiceAccount {quote(sa)} is not allowed ({allowed}; without it the run gets "
                "its own least-privilege ServiceAccount)",
            )
        )
    for fld, path in host_paths(spec):
        if ".." in path.split("/"):
            # `x/..` normalises into an allowed prefix, but the node resolves it after following
            # `x` (a link anywhere); the API server refuses backsteps in a hostPath as well
            out.append(Violation(fld, "a hostPath must not contain '..'"))
        elif not under(path, policy.allowed_host_paths):
            allowed = allowed_text(policy.allowed_host_paths, "hostPath volume")
            out.append(Violation(fld, f"hostPath {quote(path)} is not allowed ({allowed})"))
    for fld, ref in volume_refs(spec):
        if ref.sub_path is not None:
            out += check_sub_path(f"{fld}.subPath", ref.sub_path)
    if pt is not None:
        api = pt.to_api()
        out += check_pod_template(api, policy, operator_env)
        out += _check_memory_volumes_fit(api, spec, policy)
    return out


def _check_memory_volumes_fit(
    pt: Mapping[str, Any], spec: Any, policy: PodPolicy
) -> list[Violation]:
    """A ``medium: Memory`` emptyDir is charged to the pod's memory: with an explicit memory
    limit, the Memory volumes' ``sizeLimit``s must leave the worker room below it (an ``auto``
    limit adds them: :func:`~npu_lora_operator.policy.resources.auto_memory`)."""
    tmpfs = memory_volume_bytes(pt)
    res = spec.resources.to_api() if getattr(spec, "resources", None) is not None else {}
    limit = (res.get("limits") or {}).get("memory")
    where = "spec.resources.limits.memory"
    if limit is None and (res.get("requests") or {}).get("memory") is None:
        # the policy's default limit applies (an explicit one; ``auto`` adds the tmpfs itself)
        limit, where = policy.defaults("limits").get("memory"), "policy.defaultResources"
    limit_bytes = quantity_bytes(str(limit)) if limit not in (None, AUTO) else None
    if not tmpfs or limit_bytes is None or tmpfs < limit_bytes:
        return []
    return [
        Violation(
            "spec.podTemplate.volumes",
            "the emptyDir volumes with medium Memory (their sizeLimits) would take the whole "
            f"memory limit ({where}); raise the limit or lower the sizeLimits",
        )
    ]


def check_pod_template(
    pt: Mapping[str, Any], policy: PodPolicy, operator_env: Iterable[str] = ()
) -> list[Violation]:
    """The violations of ``spec.podTemplate`` (API keys): env, envFrom, volumes, mounts,
    tolerations, nodeSelector, affinity, priorityClassName, imagePullSecrets."""
    out: list[Violation] = []
    env_out, env_values = check_env(pt.get("env"), policy, operator_env)
    out += env_out
    out += check_env_from(pt.get("envFrom"), policy)
    vol_out, vol_names = check_volumes(pt.get("volumes"), policy)
    out += vol_out
    out += check_mounts(pt.get("volumeMounts"), vol_names, env_values, policy)
    out += check_tolerations(pt.get("tolerations"), policy)
    out += check_node_selector(pt.get("nodeSelector"), policy)
    out += check_affinity(pt.get("affinity"), policy)
    out += check_priority_class(pt.get("priorityClassName"), policy)
    out += check_pull_secrets(pt.get("imagePullSecrets"), policy)
    return out


def check(
    spec: Any,
    children: Iterable[Body],
    policy: PodPolicy,
    worker_image: str,
    operator_env: Iterable[str] = (),
) -> list[Violation]:
    """Every violation of a run: its spec (:func:`check_spec`) and, unless ``allowPrivileged``,
    the privileged settings of each pod template among its built ``children``."""
    out = check_spec(spec, policy, worker_image, operator_env)
    if not policy.allow_privileged:
        for child in children:
            tmpl = (child.get("spec") or {}).get("template") if child.get("kind") == "Job" else None
            if isinstance(tmpl, Mapping):
                name = (child.get("metadata") or {}).get("name", "")
                out += check_pod_spec(tmpl.get("spec") or {}, f"Job {name}: spec.template.spec")
    return out
