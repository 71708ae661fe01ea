"""Privileged settings in a built pod spec (guards the builders and the operator's own
configuration; the MoEFinetune API cannot ask for them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npu_lora_operator.policy.config import Violation


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
    for key in ("seccompProfile", "appArmorProfile"):
        prof = ctx.get(key)
        if isinstance(prof, Mapping) and prof.get("type") == "Unconfined":
            out.append(Violation(f"{where}.{key}.type", "Unconfined is not allowed"))
    if container and ctx.get("procMount") not in (None, "Default"):
        out.append(Violation(f"{where}.procMount", "only Default is allowed"))
    if not container and ctx.get("sysctls"):
        out.append(Violation(f"{where}.sysctls", "sysctls are not allowed"))
    win = ctx.get("windowsOptions")
    if isinstance(win, Mapping) and win.get("hostProcess") is True:
        out.append(Violation(f"{where}.windowsOptions.hostProcess", "not allowed"))
    return out


def check_pod_spec(pod: Mapping[str, Any], where: str) -> list[Violation]:
    """Privileged settings in a built pod spec (``where``: its path, for the message)."""
    out: list[Violation] = []
    for key in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"):
        if pod.get(key) is True:
            out.append(Violation(f"{where}.{key}", f"{key} is not allowed"))
    if pod.get("ephemeralContainers"):
        out.append(Violation(f"{where}.ephemeralContainers", "not allowed"))
    out += _privileged_in_context(pod.get("securityContext"), f"{where}.securityContext", False)
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(pod.get(kind) or []):
            ctx = c.get("securityContext") if isinstance(c, Mapping) else None
            out += _privileged_in_context(ctx, f"{where}.{kind}[{i}].securityContext", True)
    return out
