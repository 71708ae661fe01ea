"""Admission policy: what a MoEFinetune may put into its worker pod, set by the cluster admin.

Anyone allowed to create a MoEFinetune makes the operator (which may create Jobs,
ServiceAccounts, Roles and RoleBindings) start a pod; without a policy that pod could run any
image, under any ServiceAccount of the namespace, with the node's filesystem mounted. The
policy (:class:`PodPolicy`; the chart's ``policy`` values, passed to the operator as JSON in
``NPU_LORA_POLICY``) says what is allowed, and the operator refuses a run that asks for more
before any of its children exists: the run ends ``Failed`` with the condition reason
``PolicyViolation``, a Warning Event and a message naming each field (:func:`check`).

===============================  ==============================================================
``allowedImages``                 ``spec.image`` patterns (``fnmatch``: ``reg.example.com/*``,
                                  ``*`` for any); empty: the operator's worker image only
``allowedServiceAccountNames``    ``spec.podTemplate.serviceAccountName`` patterns; empty: none
                                  (each run gets its own least-privilege ServiceAccount)
``allowedHostPaths``              path prefixes a hostPath volume may name (``model``/``data``/
                                  ``output``/``compileCache`` ``volume.hostPath``,
                                  ``podTemplate.volumes[].hostPath``); empty: no hostPath
``allowPrivileged``               privileged containers, added capabilities,
                                  ``allowPrivilegeEscalation``, running as uid 0 or
                                  ``runAsNonRoot: false``, ``hostNetwork``/``hostPID``/``hostIPC``
                                  in the built pod (the spec cannot ask for them today; this
                                  guards the builders and the operator's own configuration)
``defaultResources``              requests/limits of the worker container for the keys the spec
                                  leaves unset; a memory of ``auto`` is the estimate below
``memoryWhenUnknown``             ``auto`` memory when the model's size is unknown to the
                                  operator (``model.path`` on a volume it does not mount)
===============================  ==============================================================

The ``auto`` memory estimate is the torch-free estimate the worker's pre-flight checks too
(:mod:`npu_lora.api.memory`: host-resident weights + LoRA optimizer state + activations of one
micro-batch of ``batchSize × seqLen`` tokens, a lower bound), from the model's config (a
preset's packaged config.json; ``moe.hostDtype: auto`` sized as float32, the widest choice the
worker's CPU can make), plus 25 % and 2 GiB for the Python/torch runtime, rounded up to a whole
GiB: :func:`auto_memory`. A run whose spec sets a memory
request but no limit gets a limit of at least its request; a spec limit without a request is
left to Kubernetes (the request then equals the limit).

Pure functions; no I/O except reading a preset's packaged config. Never imports torch.
"""

from __future__ import annotations

import fnmatch
import json
import math
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from npu_lora.api import memory
from npu_lora.api.memory import preset_estimate, recommended_limit

Body = dict[str, Any]

GiB = 1 << 30
AUTO = "auto"
REASON = "PolicyViolation"
#: the auto memory's allowance for the interpreter, torch, transformers and peft themselves
RUNTIME_BYTES = memory.RUNTIME_BYTES

#: the chart value keys (camelCase) -> PodPolicy attribute
_KEYS = {
    "allowedImages": "allowed_images",
    "allowedServiceAccountNames": "allowed_service_accounts",
    "allowedHostPaths": "allowed_host_paths",
    "allowPrivileged": "allow_privileged",
    "defaultResources": "default_resources",
    "memoryWhenUnknown": "memory_when_unknown",
}
_RESOURCE_KEYS = ("requests", "limits")


def _pairs(d: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in d.items() if v not in (None, ""))


@dataclass(frozen=True)
class PodPolicy:
    """The admission policy (hashable, like :class:`~npu_lora_operator.settings.OperatorConfig`).
    Defaults: the operator's worker image only, no ``serviceAccountName``, no hostPath, nothing
    privileged, ``cpu: 1`` and an ``auto`` memory request and limit."""

    allowed_images: tuple[str, ...] = ()
    allowed_service_accounts: tuple[str, ...] = ()
    allowed_host_paths: tuple[str, ...] = ()
    allow_privileged: bool = False
    #: (("requests", (("cpu", "1"), ...)), ("limits", (...)))
    default_resources: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = field(
        default=(("requests", (("cpu", "1"), ("memory", AUTO))), ("limits", (("memory", AUTO),)))
    )
    memory_when_unknown: str = "16Gi"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PodPolicy:
        """From the chart's ``policy`` values (camelCase keys). Raises ValueError naming the key
        for an unknown key or a value of the wrong type."""
        if not isinstance(data, Mapping):
            raise ValueError(f"policy: expected an object, got {type(data).__name__}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            attr = _KEYS.get(key)
            if attr is None:
                raise ValueError(f"policy.{key}: unknown key (known: {', '.join(_KEYS)})")
            if key.startswith("allowed"):
                if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                    raise ValueError(f"policy.{key}: expected a list of non-empty strings")
                if key == "allowedHostPaths" and not all(v.startswith("/") for v in value):
                    raise ValueError(f"policy.{key}: expected absolute paths, got {value}")
                kwargs[attr] = tuple(value)
            elif key == "allowPrivileged":
                if not isinstance(value, bool):
                    raise ValueError(f"policy.{key}: expected true or false, got {value!r}")
                kwargs[attr] = value
            elif key == "defaultResources":
                if not isinstance(value, Mapping) or set(value) - set(_RESOURCE_KEYS):
                    raise ValueError(f"policy.{key}: expected an object with requests/limits")
                kwargs[attr] = tuple(
                    (k, _pairs(value.get(k) or {})) for k in _RESOURCE_KEYS if k in value
                )
            else:
                if not isinstance(value, str) or not _quantity_bytes(value):
                    raise ValueError(f"policy.{key}: expected a memory quantity, got {value!r}")
                kwargs[attr] = value
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> PodPolicy:
        """From ``NPU_LORA_POLICY`` (JSON; empty: the defaults)."""
        if not text.strip():
            return cls()
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ValueError(f"NPU_LORA_POLICY: not JSON: {e}") from None
        return cls.from_mapping(data)

    def defaults(self, key: str) -> dict[str, str]:
        """``defaultResources[key]`` (``requests`` or ``limits``) as a dict."""
        return dict(dict(self.default_resources).get(key, ()))


@dataclass(frozen=True)
class Violation:
    """One refused field: its path in the MoEFinetune (or in the built pod) and why."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def describe(violations: Iterable[Violation]) -> str:
    """The run's failure message: every violation, and who can change the policy."""
    items = "; ".join(str(v) for v in violations)
    return (
        f"refused by the operator's admission policy: {items} (the cluster admin sets the "
        "policy in the chart's `policy` values)"
    )


# ---------------------------------------------------------------------------------------------
# checks


def _matches(value: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _under(path: str, prefixes: Iterable[str]) -> bool:
    """``path`` (normalised, absolute) is a prefix's directory or below it."""
    if not path.startswith("/"):
        return False
    p = posixpath.normpath(path)
    for prefix in prefixes:
        q = posixpath.normpath(prefix)
        if q == "/" or p == q or p.startswith(q + "/"):
            return True
    return False


def _allowed_text(patterns: Iterable[str], what: str) -> str:
    items = list(patterns)
    return f"allowed: {', '.join(items)}" if items else f"no {what} is allowed"


def _host_paths(spec: Any) -> list[tuple[str, str]]:
    """``(field, path)`` of every hostPath the spec names."""
    out: list[tuple[str, str]] = []
    for fld, ref in (
        ("spec.model.volume.hostPath", spec.model.volume),
        ("spec.data.volume.hostPath", spec.data.volume),
        ("spec.output.volume.hostPath", spec.output.volume),
        ("spec.device.compileCache.hostPath", spec.device.compile_cache),
    ):
        if ref is not None and ref.host_path is not None:
            out.append((fld, ref.host_path))
    pt = spec.pod_template
    for i, vol in enumerate((pt.volumes or []) if pt is not None else []):
        if isinstance(vol, Mapping) and "hostPath" in vol:
            hp = vol.get("hostPath")
            path = hp.get("path") if isinstance(hp, Mapping) else None
            out.append((f"spec.podTemplate.volumes[{i}].hostPath", str(path or "")))
    return out


def check_spec(spec: Any, policy: PodPolicy, worker_image: str) -> list[Violation]:
    """The violations of a :class:`~npu_lora.api.v1alpha1.MoEFinetuneSpec` (empty: allowed)."""
    out: list[Violation] = []
    images = policy.allowed_images or (worker_image,)
    if spec.image and spec.image != worker_image and not _matches(spec.image, images):
        out.append(
            Violation(
                "spec.image",
                f'image "{spec.image}" is not allowed ({_allowed_text(images, "image")})',
            )
        )
    pt = spec.pod_template
    sa = pt.service_account_name if pt is not None else None
    if sa and not _matches(sa, policy.allowed_service_accounts):
        allowed = _allowed_text(policy.allowed_service_accounts, "serviceAccountName")
        out.append(
            Violation(
                "spec.podTemplate.serviceAccountName",
                f'ServiceAccount "{sa}" is not allowed ({allowed}; without it the run gets '
                "its own least-privilege ServiceAccount)",
            )
        )
    for fld, path in _host_paths(spec):
        if not _under(path, policy.allowed_host_paths):
            allowed = _allowed_text(policy.allowed_host_paths, "hostPath volume")
            out.append(Violation(fld, f'hostPath "{path}" is not allowed ({allowed})'))
    return out


def _privileged_in_context(ctx: Any, where: str, container: bool) -> list[Violation]:
    if not isinstance(ctx, Mapping):
        return []
    out: list[Violation] = []
    if container and ctx.get("privileged") is True:
        out.append(Violation(f"{where}.privileged", "privileged containers are not allowed"))
    if container and ctx.get("allowPrivilegeEscalation") is True:
        out.append(
            Violation(f"{where}.allowPrivilegeEscalation", "privilege escalation is not allowed")
        )
    added = (ctx.get("capabilities") or {}).get("add") if container else None
    if added:
        out.append(
            Violation(f"{where}.capabilities.add", f"added capabilities are not allowed: {added}")
        )
    if ctx.get("runAsUser") == 0:
        out.append(Violation(f"{where}.runAsUser", "running as root (uid 0) is not allowed"))
    if ctx.get("runAsNonRoot") is False:
        out.append(Violation(f"{where}.runAsNonRoot", "runAsNonRoot: false is not allowed"))
    return out


def check_pod_spec(pod: Mapping[str, Any], where: str) -> list[Violation]:
    """Privileged settings in a built pod spec (``where``: its path, for the message)."""
    out: list[Violation] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key) is True:
            out.append(Violation(f"{where}.{key}", f"{key} is not allowed"))
    out += _privileged_in_context(pod.get("securityContext"), f"{where}.securityContext", False)
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(pod.get(kind) or []):
            ctx = c.get("securityContext") if isinstance(c, Mapping) else None
            out += _privileged_in_context(ctx, f"{where}.{kind}[{i}].securityContext", True)
    return out


def check(
    spec: Any, children: Iterable[Body], policy: PodPolicy, worker_image: str
) -> list[Violation]:
    """Every violation of a run: its spec (:func:`check_spec`) and, unless ``allowPrivileged``,
    the privileged settings of each pod template among its built ``children``."""
    out = check_spec(spec, policy, worker_image)
    if not policy.allow_privileged:
        for child in children:
            tmpl = (child.get("spec") or {}).get("template") if child.get("kind") == "Job" else None
            if isinstance(tmpl, Mapping):
                name = (child.get("metadata") or {}).get("name", "")
                out += check_pod_spec(tmpl.get("spec") or {}, f"Job {name}: spec.template.spec")
    return out


# ---------------------------------------------------------------------------------------------
# default resources

_SUFFIX = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def _quantity_bytes(text: str) -> int | None:
    """A memory quantity (``16Gi``, ``500M``, ``1073741824``) in bytes, None if not one."""
    s = str(text).strip()
    suffix = next((x for x in sorted(_SUFFIX, key=len, reverse=True) if s.endswith(x)), "")
    num, mult = (s[: -len(suffix)], _SUFFIX[suffix]) if suffix else (s, 1)
    try:
        value = float(num)
    except ValueError:
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return int(value * mult)


def _gib(n_bytes: int) -> str:
    return f"{max(1, math.ceil(n_bytes / GiB))}Gi"


def auto_memory(spec: Any, policy: PodPolicy) -> tuple[str, str]:
    """``(quantity, how it was found)``: for a preset, the torch-free estimate
    (:func:`npu_lora.api.memory.preset_estimate`, ``moe.hostDtype: auto`` sized as its widest
    choice, float32) + 25 % + 2 GiB, rounded up to a GiB; ``policy.memoryWhenUnknown`` for a
    model given by path (its config is on a volume the operator does not mount: the worker's
    pre-flight checks it against this limit before loading and names the field to set)."""
    est = preset_estimate(spec)
    if est is None:
        return policy.memory_when_unknown, "policy.memoryWhenUnknown (model size unknown)"
    return _gib(recommended_limit(est)), f"estimated from the model ({est.describe()})"


def default_resources(spec: Any, res: Mapping[str, Any], policy: PodPolicy) -> Body:
    """``res`` (the spec's requests/limits as API dicts) with the policy's defaults filled in
    for the keys it leaves unset (``auto`` memory: :func:`auto_memory`)."""
    out: Body = {k: dict(v) for k, v in res.items() if isinstance(v, Mapping)}
    requests = out.get("requests", {})
    limits = out.get("limits", {})
    auto: str | None = None
    for key, target, other in (
        ("requests", requests, limits),
        ("limits", limits, requests),
    ):
        for name, value in policy.defaults(key).items():
            if name in target:
                continue
            if key == "requests" and name in other:
                continue  # a limit without a request: Kubernetes sets the request to the limit
            if value == AUTO:
                if name != "memory":
                    continue
                auto = auto or auto_memory(spec, policy)[0]
                value = auto
            if key == "limits" and name in other:
                req, lim = _quantity_bytes(str(other[name])), _quantity_bytes(value)
                if name == "memory" and req and lim and lim < req:
                    value = str(other[name])  # never a limit below the spec's request
                elif name != "memory":
                    continue  # a CPU request of the spec's own: leave its limit unset
            target[name] = value
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out
