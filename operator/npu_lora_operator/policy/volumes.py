"""Volumes and mounts: the spec's volume references, hostPaths, ``podTemplate.volumes`` and
``volumeMounts``."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any

from npu_lora_operator.messages import bounded
from npu_lora_operator.policy.common import (
    allowed_text,
    check_sub_path,
    under,
    unknown_keys,
)
from npu_lora_operator.policy.config import PodPolicy, Violation
from npu_lora_operator.policy.env import expand_literal
from npu_lora_operator.policy.quantities import quantity_bytes
from npu_lora_operator.policy.sources import check_source, size_limit_bytes

_VOLUME_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: the operator's own volumes and mount points (a podTemplate may neither reuse nor overlap them)
OPERATOR_VOLUMES = frozenset({"config", "tmp", "model", "data", "output", "compile-cache"})
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
_MOUNT_KEYS = {"name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation"}
MAX_VOLUMES = 32


def volume_refs(spec: Any) -> list[tuple[str, Any]]:
    """``(field, VolumeRef)`` of the volumes the spec sets (model, data, output, compile cache)."""
    refs = (
        ("spec.model.volume", spec.model.volume),
        ("spec.data.volume", spec.data.volume),
        ("spec.output.volume", spec.output.volume),
        ("spec.device.compileCache", spec.device.compile_cache),
    )
    return [(f, r) for f, r in refs if r is not None]


def host_paths(spec: Any) -> list[tuple[str, str]]:
    """``(field, path)`` of every hostPath the spec names."""
    out: list[tuple[str, str]] = []
    for fld, ref in volume_refs(spec):
        if ref.host_path is not None:
            out.append((f"{fld}.hostPath", ref.host_path))
    pt = spec.pod_template
    for i, vol in enumerate((pt.volumes or []) if pt is not None else []):
        if isinstance(vol, Mapping) and "hostPath" in vol:
            hp = vol.get("hostPath")
            path = hp.get("path") if isinstance(hp, Mapping) else None
            out.append((f"spec.podTemplate.volumes[{i}].hostPath", str(path or "")))
    return out


def check_volumes(vols: Any, policy: PodPolicy) -> tuple[list[Violation], set[str]]:
    out: list[Violation] = []
    names: set[str] = set()
    disk = tmpfs = 0
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
        src_out, size = check_source(kind, v[kind], where, policy)
        out += src_out
        if kind == "emptyDir" and size is not None:
            if isinstance(v[kind], Mapping) and v[kind].get("medium") == "Memory":
                tmpfs += size
            else:
                disk += size
        # hostPath: checked against allowedHostPaths with the spec's other hostPaths
    for total, cap, key, what in (
        (disk, policy.max_empty_dir_size, "maxEmptyDirSize", "emptyDir"),
        (
            tmpfs,
            policy.max_memory_empty_dir_size,
            "maxMemoryEmptyDirSize",
            "medium Memory emptyDir",
        ),
    ):
        if total > (quantity_bytes(cap) or 0):
            out.append(
                Violation(
                    "spec.podTemplate.volumes",
                    f"the {what} volumes' sizeLimits add up to more than {cap} (policy.{key})",
                )
            )
    return out, names


def memory_volume_bytes(pt: Mapping[str, Any]) -> int:
    """What the podTemplate's ``medium: Memory`` emptyDir volumes may hold together (bytes; the
    kubelet charges tmpfs pages to the pod's memory)."""
    total = 0
    for v in pt.get("volumes") or []:
        src = v.get("emptyDir") if isinstance(v, Mapping) else None
        if isinstance(src, Mapping) and src.get("medium") == "Memory":
            total += size_limit_bytes(src.get("sizeLimit")) or 0
    return total


def _overlaps(path: str, other: str) -> bool:
    return path == other or path.startswith(other + "/") or other.startswith(path + "/")


def check_mounts(
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
        out += unknown_keys(m, _MOUNT_KEYS, where)
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
            elif not under(norm, policy.allowed_mount_paths) or norm == "/":
                allowed = allowed_text(policy.allowed_mount_paths, "mount path")
                out.append(Violation(f"{where}.mountPath", f"not allowed ({allowed})"))
            elif any(_overlaps(norm, p) for p in seen):
                out.append(Violation(f"{where}.mountPath", "overlaps another volumeMount"))
            else:
                seen.append(norm)
        if m.get("subPath") is not None:
            out += check_sub_path(f"{where}.subPath", m.get("subPath"))
        if m.get("subPathExpr") is not None:
            expr = m.get("subPathExpr")
            if m.get("subPath") is not None:
                out.append(
                    Violation(f"{where}.subPathExpr", "set subPath or subPathExpr, not both")
                )
            expanded = expand_literal(expr, env) if isinstance(expr, str) else None
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
                    for v in check_sub_path(where, expanded)
                ]
        if m.get("mountPropagation") not in (None, "None"):
            out.append(
                Violation(f"{where}.mountPropagation", "not allowed (only None, the default)")
            )
    return out
