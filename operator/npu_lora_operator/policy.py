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
``allowedSecrets``                Secret names ``podTemplate.env[].valueFrom.secretKeyRef`` and
                                  ``envFrom[].secretRef`` may read; empty: none
``allowedConfigMaps``             ConfigMap names ``env[].valueFrom.configMapKeyRef`` and
                                  ``envFrom[].configMapRef`` may read; empty: none
``allowedTolerationKeys``         toleration keys (globs); default: accelerator keys only, never
                                  a control-plane key unless listed exactly
``allowedNodeSelectorKeys``       ``nodeSelector`` / node-affinity label keys (globs); default:
                                  accelerator, topology, arch/os keys
``allowedPriorityClasses``        ``priorityClassName`` globs; empty: none; ``system-*`` only
                                  when listed exactly
``allowedMountPaths``             where ``podTemplate.volumeMounts`` may mount (path prefixes);
                                  never over the operator's own mounts
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
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from npu_lora.api import memory
from npu_lora.api.memory import preset_estimate, recommended_limit

from npu_lora_operator.messages import bounded, quote

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
    "allowedSecrets": "allowed_secrets",
    "allowedConfigMaps": "allowed_config_maps",
    "allowedTolerationKeys": "allowed_toleration_keys",
    "allowedNodeSelectorKeys": "allowed_node_selector_keys",
    "allowedPriorityClasses": "allowed_priority_classes",
    "allowedMountPaths": "allowed_mount_paths",
    "defaultResources": "default_resources",
    "memoryWhenUnknown": "memory_when_unknown",
}
_RESOURCE_KEYS = ("requests", "limits")

#: defaults of the list-valued keys that are not empty (the chart's values.yaml repeats them)
DEFAULT_TOLERATION_KEYS = ("furiosa.ai/*", "nvidia.com/gpu", "npu-lora.io/*")
DEFAULT_NODE_SELECTOR_KEYS = (
    "furiosa.ai/*",
    "nvidia.com/*",
    "npu-lora.io/*",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/*",
    "kubernetes.io/arch",
    "kubernetes.io/os",
)
DEFAULT_MOUNT_PATHS = ("/mnt/extra", "/data", "/scratch", "/dev/shm")


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
    allowed_secrets: tuple[str, ...] = ()
    allowed_config_maps: tuple[str, ...] = ()
    allowed_toleration_keys: tuple[str, ...] = DEFAULT_TOLERATION_KEYS
    allowed_node_selector_keys: tuple[str, ...] = DEFAULT_NODE_SELECTOR_KEYS
    allowed_priority_classes: tuple[str, ...] = ()
    allowed_mount_paths: tuple[str, ...] = DEFAULT_MOUNT_PATHS
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
                if value is None:
                    value = []
                if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                    raise ValueError(f"policy.{key}: expected a list of non-empty strings")
                if key in ("allowedHostPaths", "allowedMountPaths") and not all(
                    v.startswith("/") for v in value
                ):
                    raise ValueError(f"policy.{key}: expected absolute paths")
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


def _volume_refs(spec: Any) -> list[tuple[str, Any]]:
    """``(field, VolumeRef)`` of the volumes the spec sets (model, data, output, compile cache)."""
    refs = (
        ("spec.model.volume", spec.model.volume),
        ("spec.data.volume", spec.data.volume),
        ("spec.output.volume", spec.output.volume),
        ("spec.device.compileCache", spec.device.compile_cache),
    )
    return [(f, r) for f, r in refs if r is not None]


def _host_paths(spec: Any) -> list[tuple[str, str]]:
    """``(field, path)`` of every hostPath the spec names."""
    out: list[tuple[str, str]] = []
    for fld, ref in _volume_refs(spec):
        if ref.host_path is not None:
            out.append((f"{fld}.hostPath", ref.host_path))
    pt = spec.pod_template
    for i, vol in enumerate((pt.volumes or []) if pt is not None else []):
        if isinstance(vol, Mapping) and "hostPath" in vol:
            hp = vol.get("hostPath")
            path = hp.get("path") if isinstance(hp, Mapping) else None
            out.append((f"spec.podTemplate.volumes[{i}].hostPath", str(path or "")))
    return out


def check_spec(
    spec: Any, policy: PodPolicy, worker_image: str, operator_env: Iterable[str] = ()
) -> list[Violation]:
    """The violations of a :class:`~npu_lora.api.v1alpha1.MoEFinetuneSpec` (empty: allowed).
    ``operator_env``: names the operator's own configuration sets in the worker (reserved too)."""
    out: list[Violation] = []
    images = policy.allowed_images or (worker_image,)
    if spec.image and spec.image != worker_image and not _matches(spec.image, images):
        out.append(
            Violation(
                "spec.image",
                f"image {quote(spec.image)} is not allowed ({_allowed_text(images, 'image')})",
            )
        )
    pt = spec.pod_template
    sa = pt.service_account_name if pt is not None else None
    if sa and not _matches(sa, policy.allowed_service_accounts):
        allowed = _allowed_text(policy.allowed_service_accounts, "serviceAccountName")
        out.append(
            Violation(
                "spec.podTemplate.serviceAccountName",
                f"ServiceAccount {quote(sa)} is not allowed ({allowed}; without it the run gets "
                "its own least-privilege ServiceAccount)",
            )
        )
    for fld, path in _host_paths(spec):
        if not _under(path, policy.allowed_host_paths):
            allowed = _allowed_text(policy.allowed_host_paths, "hostPath volume")
            out.append(Violation(fld, f"hostPath {quote(path)} is not allowed ({allowed})"))
    for fld, ref in _volume_refs(spec):
        if ref.sub_path is not None:
            out += _check_sub_path(f"{fld}.subPath", ref.sub_path)
    if pt is not None:
        out += check_pod_template(pt.to_api(), policy, operator_env)
    return out


# ---------------------------------------------------------------------------------------------
# podTemplate: an allow-list of what reaches the pod

#: environment the worker, Python, torch, furiosa and the loader own: names (exact) and
#: prefixes a podTemplate may not set (compared in upper case)
RESERVED_ENV_NAMES = frozenset(
    {
        "HOME",
        "PATH",
        "TMPDIR",
        "TMP",
        "TEMP",
        "USER",
        "SHELL",
        "KUBECONFIG",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "JOB_COMPLETION_INDEX",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "BASH_ENV",
        "ENV",
    }
)
RESERVED_ENV_PREFIXES = (
    "PYTHON",
    "LD_",
    "XDG_",
    "NPU_LORA_",
    "TORCH",
    "PYTORCH_",
    "FURIOSA",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "MALLOC_",
    "GLIBC_",
    "CUDA_",
    "NCCL_",
    "GLOO_",
    "MASTER_",
    "TORCHELASTIC_",
    "SSL_",
    "KUBERNETES_",
    "TRITON_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_DNS1123_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VOLUME_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: the operator's own volumes and mount points (a podTemplate may neither reuse nor overlap them)
OPERATOR_VOLUMES = frozenset({"config", "tmp", "model", "data", "output", "furiosa-cache"})
OPERATOR_MOUNTS = (
    "/etc/npu-lora",
    "/tmp",
    "/mnt/model",
    "/mnt/data",
    "/mnt/output",
    "/mnt/cache",
    "/dev/termination-log",
)
#: volume sources a podTemplate may use (``hostPath`` only under ``allowedHostPaths``)
ALLOWED_VOLUME_SOURCES = ("persistentVolumeClaim", "emptyDir", "configMap", "hostPath")
_ENV_KEYS = {"name", "value", "valueFrom"}
_ENV_FROM_KEYS = {"prefix", "secretRef", "configMapRef"}
_MOUNT_KEYS = {"name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation"}
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
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
#: node labels that place a pod on the control plane: never allowed unless listed exactly
CONTROL_PLANE_KEYS = (
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
    "node-role.kubernetes.io/etcd",
)
MAX_ENV = 128
MAX_VOLUMES = 32
MAX_TOLERATIONS = 32
MAX_SELECTOR = 32


def reserved_env(name: str) -> bool:
    """``name`` is owned by the worker or its runtime (:data:`RESERVED_ENV_NAMES`/``PREFIXES``)."""
    up = name.upper()
    return up in RESERVED_ENV_NAMES or up.startswith(RESERVED_ENV_PREFIXES)


def _prefix_can_form_reserved(prefix: str) -> bool:
    """Some key appended to ``prefix`` could make a reserved name."""
    up = prefix.upper()
    if up.startswith(RESERVED_ENV_PREFIXES):
        return True
    return any(n.startswith(up) for n in RESERVED_ENV_NAMES) or any(
        r.startswith(up) for r in RESERVED_ENV_PREFIXES
    )


def _allowed_name(name: Any, patterns: Iterable[str]) -> bool:
    return (
        isinstance(name, str) and _DNS1123_RE.match(name) is not None and _matches(name, patterns)
    )


def _key_allowed(key: Any, patterns: Iterable[str]) -> bool:
    """A label key against a glob allow-list; control-plane keys and the system prefixes only
    when listed exactly (a glob like ``*`` does not reach them)."""
    if not isinstance(key, str) or not key or len(key) > 317:
        return False
    if key in CONTROL_PLANE_KEYS or key.startswith("node-role.kubernetes.io/"):
        return key in patterns
    return _matches(key, patterns)


def _unknown_keys(item: Mapping[str, Any], known: set[str], where: str) -> list[Violation]:
    extra = sorted(str(k) for k in item if k not in known)
    if not extra:
        return []
    return [
        Violation(
            f"{where}.{bounded(extra[0], 64)}",
            f"unknown field (allowed: {', '.join(sorted(known))})",
        )
    ]


def _check_sub_path(where: str, sub: Any) -> list[Violation]:
    if not isinstance(sub, str):
        return [Violation(where, "expected a relative path")]
    if sub.startswith("/") or "\\" in sub or "\x00" in sub:
        return [Violation(where, "must be a relative path (no leading '/')")]
    if ".." in sub.split("/"):
        return [Violation(where, "must not contain '..' (it may not climb out of the volume)")]
    return []


def _check_env(
    env: Any, policy: PodPolicy, operator_env: Iterable[str] = ()
) -> tuple[list[Violation], dict[str, str | None]]:
    """Violations of ``podTemplate.env`` and the literal values by name (None: not literal)."""
    out: list[Violation] = []
    values: dict[str, str | None] = {}
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
        out += _unknown_keys(e, _ENV_KEYS, where)
        name = e.get("name")
        if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
            out.append(
                Violation(f"{where}.name", "must be a C identifier ([A-Za-z_][A-Za-z0-9_]*)")
            )
            continue
        if name in set(operator_env):
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
            values[name] = v if isinstance(v, str) else None
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
    if kind == "secretKeyRef":
        if not _allowed_name(ref.get("name"), policy.allowed_secrets):
            allowed = _allowed_text(policy.allowed_secrets, "Secret")
            return [Violation(f"{where}.secretKeyRef.name", f"Secret not allowed ({allowed})")]
        return []
    if kind == "configMapKeyRef":
        if not _allowed_name(ref.get("name"), policy.allowed_config_maps):
            allowed = _allowed_text(policy.allowed_config_maps, "ConfigMap")
            return [
                Violation(f"{where}.configMapKeyRef.name", f"ConfigMap not allowed ({allowed})")
            ]
        return []
    if kind == "fieldRef":
        if ref.get("fieldPath") not in _FIELD_PATHS:
            return [
                Violation(
                    f"{where}.fieldRef.fieldPath",
                    f"not allowed (allowed: {', '.join(sorted(_FIELD_PATHS))})",
                )
            ]
        return []
    if kind == "resourceFieldRef":
        return []
    return [
        Violation(
            f"{where}.{bounded(str(kind), 64)}",
            "source not allowed (allowed: secretKeyRef and configMapKeyRef for the names in "
            "policy.allowedSecrets/allowedConfigMaps, fieldRef, resourceFieldRef)",
        )
    ]


def _check_env_from(env_from: Any, policy: PodPolicy) -> list[Violation]:
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
        out += _unknown_keys(e, _ENV_FROM_KEYS, where)
        sources = [k for k in ("secretRef", "configMapRef") if k in e]
        if len(sources) != 1:
            out.append(Violation(where, "set exactly one of secretRef or configMapRef"))
            continue
        kind = sources[0]
        ref = e[kind] if isinstance(e[kind], Mapping) else {}
        names = policy.allowed_secrets if kind == "secretRef" else policy.allowed_config_maps
        what = "Secret" if kind == "secretRef" else "ConfigMap"
        if not _allowed_name(ref.get("name"), names):
            out.append(
                Violation(
                    f"{where}.{kind}.name", f"{what} not allowed ({_allowed_text(names, what)})"
                )
            )
        prefix = e.get("prefix")
        if (
            not isinstance(prefix, str)
            or not _ENV_NAME_RE.match(prefix)
            or _prefix_can_form_reserved(prefix)
        ):
            out.append(
                Violation(
                    f"{where}.prefix",
                    "required: a C identifier that cannot begin a reserved name (e.g. APP_), so "
                    "imported keys never set the worker's own variables",
                )
            )
    return out


def _check_volumes(vols: Any, policy: PodPolicy) -> tuple[list[Violation], set[str]]:
    out: list[Violation] = []
    names: set[str] = set()
    if vols is None:
        return out, names
    if not isinstance(vols, list) or len(vols) > MAX_VOLUMES:
        return [
            Violation("spec.podTemplate.volumes", f"expected a list of at most {MAX_VOLUMES}")
        ], names
    for i, v in enumerate(vols):
        where = f"spec.podTemplate.volumes[{i}]"
        if not isinstance(v, Mapping):
            out.append(Violation(where, "expected an object"))
            continue
        name = v.get("name")
        if not isinstance(name, str) or not _VOLUME_NAME_RE.match(name) or len(name) > 63:
            out.append(Violation(f"{where}.name", "must be a DNS-1123 label"))
        elif name in OPERATOR_VOLUMES or name in names:
            out.append(
                Violation(
                    f"{where}.name",
                    f"{name} is taken (the operator's volumes: "
                    f"{', '.join(sorted(OPERATOR_VOLUMES))}; names must be unique)",
                )
            )
        else:
            names.add(name)
        sources = [k for k in v if k != "name"]
        bad = [k for k in sources if k not in ALLOWED_VOLUME_SOURCES]
        if bad or len(sources) != 1:
            out.append(
                Violation(
                    f"{where}.{bounded(str(bad[0]), 64)}" if bad else where,
                    "volume type not allowed: exactly one of "
                    f"{', '.join(ALLOWED_VOLUME_SOURCES)} (hostPath under "
                    "policy.allowedHostPaths)",
                )
            )
            continue
        kind = sources[0]
        src = v[kind] if isinstance(v[kind], Mapping) else {}
        if kind == "persistentVolumeClaim":
            claim = src.get("claimName")
            if not isinstance(claim, str) or not _DNS1123_RE.match(claim) or len(claim) > 253:
                out.append(
                    Violation(f"{where}.persistentVolumeClaim.claimName", "must be a DNS-1123 name")
                )
            out += _unknown_keys(src, {"claimName", "readOnly"}, f"{where}.persistentVolumeClaim")
        elif kind == "emptyDir":
            out += _unknown_keys(src, {"medium", "sizeLimit"}, f"{where}.emptyDir")
            if src.get("medium") not in (None, "", "Memory"):
                out.append(Violation(f"{where}.emptyDir.medium", 'allowed: "" or Memory'))
        elif kind == "configMap":
            cm = src.get("name")
            if not isinstance(cm, str) or not _DNS1123_RE.match(cm) or len(cm) > 253:
                out.append(Violation(f"{where}.configMap.name", "must be a DNS-1123 name"))
            out += _unknown_keys(
                src, {"name", "items", "defaultMode", "optional"}, f"{where}.configMap"
            )
            for j, item in enumerate(src.get("items") or []):
                path = item.get("path") if isinstance(item, Mapping) else None
                out += _check_sub_path(f"{where}.configMap.items[{j}].path", path)
            mode = src.get("defaultMode")
            if mode is not None and (not isinstance(mode, int) or mode & ~0o777 or mode & 0o6000):
                out.append(Violation(f"{where}.configMap.defaultMode", "must be within 0777"))
        # hostPath: checked against allowedHostPaths with the spec's other hostPaths
    return out, names


def _expand(expr: str, env: Mapping[str, str | None]) -> str | None:
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


def _overlaps(path: str, other: str) -> bool:
    return path == other or path.startswith(other + "/") or other.startswith(path + "/")


def _check_mounts(
    mounts: Any, volumes: set[str], env: Mapping[str, str | None], policy: PodPolicy
) -> list[Violation]:
    out: list[Violation] = []
    if mounts is None:
        return out
    if not isinstance(mounts, list) or len(mounts) > MAX_VOLUMES:
        return [Violation("spec.podTemplate.volumeMounts", f"expected at most {MAX_VOLUMES}")]
    seen: list[str] = []
    for i, m in enumerate(mounts):
        where = f"spec.podTemplate.volumeMounts[{i}]"
        if not isinstance(m, Mapping):
            out.append(Violation(where, "expected an object"))
            continue
        out += _unknown_keys(m, _MOUNT_KEYS, where)
        if m.get("name") not in volumes:
            out.append(
                Violation(
                    f"{where}.name",
                    "must name one of spec.podTemplate.volumes (not the operator's own volumes)",
                )
            )
        path = m.get("mountPath")
        if not isinstance(path, str) or not path.startswith("/") or len(path) > 4096:
            out.append(Violation(f"{where}.mountPath", "must be an absolute path"))
        else:
            norm = posixpath.normpath(path)
            if ".." in path.split("/") or norm != path.rstrip("/") or "\x00" in path:
                out.append(Violation(f"{where}.mountPath", "must be a normalised path (no '..')"))
            elif any(_overlaps(norm, p) for p in OPERATOR_MOUNTS):
                out.append(
                    Violation(
                        f"{where}.mountPath",
                        f"overlaps the operator's mounts ({', '.join(OPERATOR_MOUNTS)})",
                    )
                )
            elif not _under(norm, policy.allowed_mount_paths) or norm == "/":
                allowed = _allowed_text(policy.allowed_mount_paths, "mount path")
                out.append(Violation(f"{where}.mountPath", f"not allowed ({allowed})"))
            elif any(_overlaps(norm, p) for p in seen):
                out.append(Violation(f"{where}.mountPath", "overlaps another volumeMount"))
            else:
                seen.append(norm)
        if m.get("subPath") is not None:
            out += _check_sub_path(f"{where}.subPath", m.get("subPath"))
        if m.get("subPathExpr") is not None:
            expr = m.get("subPathExpr")
            if m.get("subPath") is not None:
                out.append(
                    Violation(f"{where}.subPathExpr", "set subPath or subPathExpr, not both")
                )
            expanded = _expand(expr, env) if isinstance(expr, str) else None
            if expanded is None:
                out.append(
                    Violation(
                        f"{where}.subPathExpr",
                        "may only use $(VAR) of literal podTemplate.env values or "
                        "NPU_LORA_RESOURCE_NAME/NAMESPACE",
                    )
                )
            else:
                out += [
                    Violation(f"{where}.subPathExpr", v.message)
                    for v in _check_sub_path(where, expanded)
                ]
        if m.get("mountPropagation") not in (None, "None"):
            out.append(
                Violation(f"{where}.mountPropagation", "not allowed (only None, the default)")
            )
    return out


def _check_tolerations(tols: Any, policy: PodPolicy) -> list[Violation]:
    out: list[Violation] = []
    if tols is None:
        return out
    if not isinstance(tols, list) or len(tols) > MAX_TOLERATIONS:
        return [Violation("spec.podTemplate.tolerations", f"at most {MAX_TOLERATIONS}")]
    allowed = _allowed_text(policy.allowed_toleration_keys, "toleration key")
    for i, t in enumerate(tols):
        where = f"spec.podTemplate.tolerations[{i}]"
        if not isinstance(t, Mapping):
            out.append(Violation(where, "expected an object"))
            continue
        out += _unknown_keys(t, _TOLERATION_KEYS, where)
        key = t.get("key")
        if key in (None, ""):
            if "*" not in policy.allowed_toleration_keys:
                out.append(
                    Violation(
                        f"{where}.key", f"required (an empty key tolerates every taint; {allowed})"
                    )
                )
        elif not _key_allowed(key, policy.allowed_toleration_keys):
            out.append(Violation(f"{where}.key", f"toleration key not allowed ({allowed})"))
        if t.get("operator") not in (None, "Equal", "Exists"):
            out.append(Violation(f"{where}.operator", "allowed: Equal, Exists"))
        if t.get("effect") not in (None, "", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            out.append(
                Violation(f"{where}.effect", "allowed: NoSchedule, PreferNoSchedule, NoExecute")
            )
    return out


def _check_selector_keys(keys: Iterable[Any], where: str, policy: PodPolicy) -> list[Violation]:
    allowed = _allowed_text(policy.allowed_node_selector_keys, "node label key")
    return [
        Violation(where, f"node label key not allowed ({allowed})")
        for k in keys
        if not _key_allowed(k, policy.allowed_node_selector_keys)
    ]


def _node_terms(terms: Any, where: str, policy: PodPolicy) -> list[Violation]:
    out: list[Violation] = []
    if not isinstance(terms, list):
        return [Violation(where, "expected a list")]
    for j, term in enumerate(terms):
        tw = f"{where}[{j}]"
        if not isinstance(term, Mapping):
            out.append(Violation(tw, "expected an object"))
            continue
        out += _unknown_keys(term, {"matchExpressions", "matchFields"}, tw)
        if term.get("matchFields"):
            out.append(Violation(f"{tw}.matchFields", "not allowed (it pins node names)"))
        for k, expr in enumerate(term.get("matchExpressions") or []):
            key = expr.get("key") if isinstance(expr, Mapping) else None
            out += _check_selector_keys([key], f"{tw}.matchExpressions[{k}].key", policy)
    return out


def _check_affinity(aff: Any, policy: PodPolicy) -> list[Violation]:
    where = "spec.podTemplate.affinity"
    if aff is None:
        return []
    if not isinstance(aff, Mapping):
        return [Violation(where, "expected an object")]
    out = _unknown_keys(aff, {"nodeAffinity", "podAntiAffinity"}, where)
    na = aff.get("nodeAffinity")
    if na is not None:
        if not isinstance(na, Mapping):
            return [*out, Violation(f"{where}.nodeAffinity", "expected an object")]
        nw = f"{where}.nodeAffinity"
        req_key = "requiredDuringSchedulingIgnoredDuringExecution"
        pref_key = "preferredDuringSchedulingIgnoredDuringExecution"
        out += _unknown_keys(na, {req_key, pref_key}, nw)
        req = na.get(req_key)
        if req is not None:
            terms = req.get("nodeSelectorTerms") if isinstance(req, Mapping) else None
            out += _node_terms(terms or [], f"{nw}.{req_key}.nodeSelectorTerms", policy)
        for j, p in enumerate(na.get(pref_key) or []):
            pref = p.get("preference") if isinstance(p, Mapping) else None
            out += _node_terms([pref or {}], f"{nw}.{pref_key}[{j}].preference", policy)
    anti = aff.get("podAntiAffinity")
    if anti is not None:
        # anti-affinity can only keep the pod away from others; only within its own namespace
        text = json.dumps(anti)
        if '"namespaces"' in text or '"namespaceSelector"' in text:
            out.append(
                Violation(f"{where}.podAntiAffinity", "namespaces/namespaceSelector not allowed")
            )
    return out


def check_pod_template(
    pt: Mapping[str, Any], policy: PodPolicy, operator_env: Iterable[str] = ()
) -> list[Violation]:
    """The violations of ``spec.podTemplate`` (API keys): env, envFrom, volumes, mounts,
    tolerations, nodeSelector, affinity, priorityClassName, imagePullSecrets."""
    out: list[Violation] = []
    env_out, env_values = _check_env(pt.get("env"), policy, operator_env)
    out += env_out
    out += _check_env_from(pt.get("envFrom"), policy)
    vol_out, vol_names = _check_volumes(pt.get("volumes"), policy)
    out += vol_out
    out += _check_mounts(pt.get("volumeMounts"), vol_names, env_values, policy)
    out += _check_tolerations(pt.get("tolerations"), policy)
    sel = pt.get("nodeSelector")
    if sel is not None:
        if not isinstance(sel, Mapping) or len(sel) > MAX_SELECTOR:
            out.append(Violation("spec.podTemplate.nodeSelector", f"at most {MAX_SELECTOR} keys"))
        else:
            for key in sel:
                out += _check_selector_keys(
                    [key], f"spec.podTemplate.nodeSelector[{quote(key)}]", policy
                )
    out += _check_affinity(pt.get("affinity"), policy)
    pc = pt.get("priorityClassName")
    if pc is not None:
        ok = _allowed_name(pc, policy.allowed_priority_classes)
        if isinstance(pc, str) and pc.startswith("system-"):
            ok = pc in policy.allowed_priority_classes
        if not ok:
            allowed = _allowed_text(policy.allowed_priority_classes, "priorityClassName")
            out.append(
                Violation(
                    "spec.podTemplate.priorityClassName",
                    f"priority class not allowed ({allowed}; system-* only when listed exactly)",
                )
            )
    for i, s in enumerate(pt.get("imagePullSecrets") or []):
        name = s.get("name") if isinstance(s, Mapping) else None
        if not isinstance(name, str) or not _DNS1123_RE.match(name) or set(s) - {"name"}:
            out.append(
                Violation(f"spec.podTemplate.imagePullSecrets[{i}]", "expected {name: <DNS name>}")
            )
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
