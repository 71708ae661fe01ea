"""``podTemplate.env`` and ``envFrom``: reserved names, allowed sources, literal values."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from npu_lora_operator.messages import bounded
from npu_lora_operator.policy.common import allowed_name, allowed_text, unknown_keys
from npu_lora_operator.policy.config import PodPolicy, Violation
from npu_lora_operator.policy.reserved import prefix_can_form_reserved, reserved_env

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_ENV_KEYS = {"name", "value", "valueFrom"}
_ENV_FROM_KEYS = {"prefix", "secretRef", "configMapRef"}
#: downward-API fields an env var may read (about the pod itself)
_FIELD_PATHS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.hostIP",
        "status.podIP",
    }
)
#: resources an env var may read of the worker container (``resourceFieldRef``)
_RESOURCE_FIELDS = frozenset(
    f"{k}.{r}" for k in ("limits", "requests") for r in ("cpu", "memory", "ephemeral-storage")
)
#: the worker container's name (npu_lora_operator.builders.CONTAINER_NAME)
WORKER_CONTAINER = "worker"
MAX_ENV = 128


def check_env(
    env: Any, policy: PodPolicy, operator_env: Iterable[str] = ()
) -> tuple[list[Violation], dict[str, str | None]]:
    """Violations of ``podTemplate.env`` and the literal values by name (None: not literal)."""
    out: list[Violation] = []
    values: dict[str, str | None] = {}
    own = set(operator_env)
    if env is None:
        return out, values
    if not isinstance(env, list) or len(env) > MAX_ENV:
        return [
            Violation("spec.podTemplate.env", f"expected a list of at most {MAX_ENV} items")
        ], {}
    for i, e in enumerate(env):
        where = f"spec.podTemplate.env[{i}]"
        if not isinstance(e, Mapping):
            out.append(Violation(where, "expected an object {name, value | valueFrom}"))
            continue
        out += unknown_keys(e, _ENV_KEYS, where)
        name = e.get("name")
        if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
            out.append(
                Violation(f"{where}.name", "must be a C identifier ([A-Za-z_][A-Za-z0-9_]*)")
            )
            continue
        if name in values:
            out.append(Violation(f"{where}.name", f"{name} is set twice (names must be unique)"))
        if name in own:
            out.append(Violation(f"{where}.name", f"{name} is set by the operator's configuration"))
        elif reserved_env(name):
            out.append(
                Violation(
                    f"{where}.name",
                    f"{name} is reserved for the worker and its runtime (e.g. PYTHON*, LD_*, "
                    "HOME, PATH, XDG_*, NPU_LORA_*, TORCH*, FURIOSA*, OMP_*, MKL_*; see "
                    "docs/security.md)",
                )
            )
        vf = e.get("valueFrom")
        if vf is None:
            v = e.get("value")
            # the kubelet expands $(VAR) in a value: not a literal then (it may hold a Secret's)
            values[name] = v if isinstance(v, str) and "$(" not in v else None
            continue
        values[name] = None
        if "value" in e:
            out.append(Violation(f"{where}.value", "set either value or valueFrom, not both"))
        out += _check_value_from(vf, f"{where}.valueFrom", policy)
    return out, values


def _check_value_from(vf: Any, where: str, policy: PodPolicy) -> list[Violation]:
    if not isinstance(vf, Mapping) or len(vf) != 1:
        return [Violation(where, "expected exactly one source")]
    ((kind, ref),) = vf.items()
    ref = ref if isinstance(ref, Mapping) else {}
    if kind in ("secretKeyRef", "configMapKeyRef"):
        bad = unknown_keys(ref, {"name", "key", "optional"}, f"{where}.{kind}")
        if bad:
            return bad
    if kind == "secretKeyRef":
        if not allowed_name(ref.get("name"), policy.allowed_secrets):
            allowed = allowed_text(policy.allowed_secrets, "Secret")
            return [Violation(f"{where}.secretKeyRef.name", f"Secret not allowed ({allowed})")]
        return []
    if kind == "configMapKeyRef":
        if not allowed_name(ref.get("name"), policy.allowed_config_maps):
            allowed = allowed_text(policy.allowed_config_maps, "ConfigMap")
            return [
                Violation(f"{where}.configMapKeyRef.name", f"ConfigMap not allowed ({allowed})")
            ]
        return []
    if kind == "fieldRef":
        out = unknown_keys(ref, {"fieldPath", "apiVersion"}, f"{where}.fieldRef")
        if ref.get("fieldPath") not in _FIELD_PATHS:
            out.append(
                Violation(
                    f"{where}.fieldRef.fieldPath",
                    f"not allowed (allowed: {', '.join(sorted(_FIELD_PATHS))})",
                )
            )
        return out
    if kind == "resourceFieldRef":
        rw = f"{where}.resourceFieldRef"
        out = unknown_keys(ref, {"containerName", "resource", "divisor"}, rw)
        if ref.get("containerName") not in (None, "", WORKER_CONTAINER):
            out.append(Violation(f"{rw}.containerName", f"allowed: {WORKER_CONTAINER} (or unset)"))
        if ref.get("resource") not in _RESOURCE_FIELDS:
            out.append(
                Violation(f"{rw}.resource", f"allowed: {', '.join(sorted(_RESOURCE_FIELDS))}")
            )
        return out
    return [
        Violation(
            f"{where}.{bounded(str(kind), 64)}",
            "source not allowed (allowed: secretKeyRef and configMapKeyRef for the names in "
            "policy.allowedSecrets/allowedConfigMaps, fieldRef, resourceFieldRef)",
        )
    ]


def check_env_from(env_from: Any, policy: PodPolicy) -> list[Violation]:
    out: list[Violation] = []
    if env_from is None:
        return out
    if not isinstance(env_from, list) or len(env_from) > MAX_ENV:
        return [Violation("spec.podTemplate.envFrom", f"expected a list of at most {MAX_ENV}")]
    for i, e in enumerate(env_from):
        where = f"spec.podTemplate.envFrom[{i}]"
        if not isinstance(e, Mapping):
            out.append(Violation(where, "expected an object"))
            continue
        out += unknown_keys(e, _ENV_FROM_KEYS, where)
        sources = [k for k in ("secretRef", "configMapRef") if k in e]
        if len(sources) != 1:
            out.append(Violation(where, "set exactly one of secretRef or configMapRef"))
            continue
        kind = sources[0]
        ref = e[kind] if isinstance(e[kind], Mapping) else {}
        out += unknown_keys(ref, {"name", "optional"}, f"{where}.{kind}")
        names = policy.allowed_secrets if kind == "secretRef" else policy.allowed_config_maps
        what = "Secret" if kind == "secretRef" else "ConfigMap"
        if not allowed_name(ref.get("name"), names):
            out.append(
                Violation(
                    f"{where}.{kind}.name", f"{what} not allowed ({allowed_text(names, what)})"
                )
            )
        prefix = e.get("prefix")
        if (
            not isinstance(prefix, str)
            or not _ENV_NAME_RE.match(prefix)
            or prefix_can_form_reserved(prefix)
        ):
            out.append(
                Violation(
                    f"{where}.prefix",
                    "required: a C identifier that cannot begin a reserved name (e.g. APP_), so "
                    "imported keys never set the worker's own variables",
                )
            )
    return out


def expand_literal(expr: str, env: Mapping[str, str | None]) -> str | None:
    """``subPathExpr`` with ``$(VAR)`` replaced by the podTemplate's literal values (None: a
    variable whose value is unknown here, e.g. from a Secret)."""
    failed = False

    def sub(m: re.Match[str]) -> str:
        nonlocal failed
        name = m.group(1)
        if name in env and env[name] is not None:
            return str(env[name])
        if name in ("NPU_LORA_RESOURCE_NAME", "NPU_LORA_RESOURCE_NAMESPACE"):
            return "x"  # DNS labels: no '/' and no '..'
        failed = True
        return ""

    out = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, expr)
    return None if failed else out
