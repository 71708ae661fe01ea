"""The sources a ``podTemplate.volumes`` entry may use: ``persistentVolumeClaim``, ``emptyDir``,
``configMap`` (``hostPath``: with the spec's other hostPaths, against ``allowedHostPaths``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npu_lora_operator.policy.common import (
    DNS1123_RE,
    allowed_name,
    allowed_text,
    check_sub_path,
    unknown_keys,
)
from npu_lora_operator.policy.config import PodPolicy, Violation
from npu_lora_operator.policy.quantities import QUANTITY_RE, quantity_bytes

#: file modes a configMap volume may set: no setuid/setgid/sticky bits
_MODE_MASK = 0o777


def size_limit_bytes(value: Any) -> int | None:
    """An emptyDir ``sizeLimit`` in bytes (None: absent, not a quantity, or not positive)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value)
    return quantity_bytes(text) if QUANTITY_RE.fullmatch(text) else None


def _mode_ok(mode: Any) -> bool:
    return mode is None or (
        isinstance(mode, int) and not isinstance(mode, bool) and 0 <= mode <= _MODE_MASK
    )


def check_source(
    kind: str, src: Any, where: str, policy: PodPolicy
) -> tuple[list[Violation], int | None]:
    """Violations of one volume source and, for an ``emptyDir``, its ``sizeLimit`` in bytes."""
    out: list[Violation] = []
    src = src if isinstance(src, Mapping) else {}
    if kind == "persistentVolumeClaim":
        claim = src.get("claimName")
        if not isinstance(claim, str) or not DNS1123_RE.match(claim) or len(claim) > 253:
            out.append(
                Violation(f"{where}.persistentVolumeClaim.claimName", "must be a DNS-1123 name")
            )
        out += unknown_keys(src, {"claimName", "readOnly"}, f"{where}.persistentVolumeClaim")
        return out, None
    if kind == "emptyDir":
        out += unknown_keys(src, {"medium", "sizeLimit"}, f"{where}.emptyDir")
        medium = src.get("medium")
        if medium not in (None, "", "Memory"):
            out.append(Violation(f"{where}.emptyDir.medium", 'allowed: "" or Memory'))
        size = size_limit_bytes(src.get("sizeLimit"))
        if size is None:
            cap = policy.max_memory_empty_dir_size if medium == "Memory" else None
            out.append(
                Violation(
                    f"{where}.emptyDir.sizeLimit",
                    "required: a positive quantity (e.g. 1Gi) of at most "
                    f"{cap or policy.max_empty_dir_size} (policy.maxEmptyDirSize, "
                    "maxMemoryEmptyDirSize for medium Memory)",
                )
            )
        return out, size
    if kind == "configMap":
        cw = f"{where}.configMap"
        cm = src.get("name")
        if not isinstance(cm, str) or not DNS1123_RE.match(cm) or len(cm) > 253:
            out.append(Violation(f"{cw}.name", "must be a DNS-1123 name"))
        elif not allowed_name(cm, policy.allowed_config_maps):
            # the same rule as env from a ConfigMap: a volume reads it just as well
            allowed = allowed_text(policy.allowed_config_maps, "ConfigMap")
            out.append(Violation(f"{cw}.name", f"ConfigMap not allowed ({allowed})"))
        out += unknown_keys(src, {"name", "items", "defaultMode", "optional"}, cw)
        items = src.get("items") or []
        if not isinstance(items, list):
            return [*out, Violation(f"{cw}.items", "expected a list")], None
        for j, item in enumerate(items):
            iw = f"{cw}.items[{j}]"
            if not isinstance(item, Mapping):
                out.append(Violation(iw, "expected an object {key, path, mode}"))
                continue
            out += unknown_keys(item, {"key", "path", "mode"}, iw)
            out += check_sub_path(f"{iw}.path", item.get("path"))
            if not _mode_ok(item.get("mode")):
                out.append(Violation(f"{iw}.mode", "must be within 0777 (no setuid/setgid)"))
        if not _mode_ok(src.get("defaultMode")):
            out.append(Violation(f"{cw}.defaultMode", "must be within 0777 (no setuid/setgid)"))
    if kind == "hostPath":  # the path: against allowedHostPaths with the spec's others
        out += unknown_keys(src, {"path", "type"}, f"{where}.hostPath")
    return out, None
