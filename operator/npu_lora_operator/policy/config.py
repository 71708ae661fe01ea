"""The policy's values (:class:`PodPolicy`, from the chart's ``policy`` values or
``NPU_LORA_POLICY``), one refused field (:class:`Violation`) and the run's failure message."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from npu_lora.api import backends as registry

from npu_lora_operator.policy.quantities import quantity_bytes

Body = dict[str, Any]
AUTO = "auto"
REASON = "PolicyViolation"
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
    "allowedImagePullSecrets": "allowed_image_pull_secrets",
    "maxEmptyDirSize": "max_empty_dir_size",
    "maxMemoryEmptyDirSize": "max_memory_empty_dir_size",
    "defaultResources": "default_resources",
    "memoryWhenUnknown": "memory_when_unknown",
}
_RESOURCE_KEYS = ("requests", "limits")
#: defaults of the list-valued keys that are not empty (the chart's values.yaml repeats them,
#: checked equal by tests/chart): the backends' taint and node-label keys come from the registry
DEFAULT_TOLERATION_KEYS = (*registry.taint_keys(), "npu-lora.io/*")
DEFAULT_NODE_SELECTOR_KEYS = (
    *registry.node_keys(),
    "npu-lora.io/*",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/*",
    "kubernetes.io/arch",
    "kubernetes.io/os",
)
DEFAULT_MOUNT_PATHS = ("/mnt/extra", "/data", "/scratch", "/dev/shm")
DEFAULT_MAX_EMPTY_DIR = "32Gi"
DEFAULT_MAX_MEMORY_EMPTY_DIR = "8Gi"


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
    allowed_image_pull_secrets: tuple[str, ...] = ()
    #: the most all of a pod's disk-backed emptyDir volumes may hold together (``sizeLimit``s)
    max_empty_dir_size: str = DEFAULT_MAX_EMPTY_DIR
    #: the most its ``medium: Memory`` (tmpfs) emptyDir volumes may hold together
    max_memory_empty_dir_size: str = DEFAULT_MAX_MEMORY_EMPTY_DIR
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
                if not isinstance(value, str) or not quantity_bytes(value):
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
