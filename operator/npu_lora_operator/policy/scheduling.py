"""Where the pod may run: tolerations, nodeSelector, affinity, priority class."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from npu_lora_operator.messages import quote
from npu_lora_operator.policy.common import allowed_name, allowed_text, key_allowed, unknown_keys
from npu_lora_operator.policy.config import PodPolicy, Violation

_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
MAX_TOLERATIONS = 32
MAX_SELECTOR = 32


def check_tolerations(tols: Any, policy: PodPolicy) -> list[Violation]:
    out: list[Violation] = []
    if tols is None:
        return out
    if not isinstance(tols, list) or len(tols) > MAX_TOLERATIONS:
        return [Violation("spec.podTemplate.tolerations", f"at most {MAX_TOLERATIONS}")]
    allowed = allowed_text(policy.allowed_toleration_keys, "toleration key")
    for i, t in enumerate(tols):
        where = f"spec.podTemplate.tolerations[{i}]"
        if not isinstance(t, Mapping):
            out.append(Violation(where, "expected an object"))
            continue
        out += unknown_keys(t, _TOLERATION_KEYS, where)
        key = t.get("key")
        if key in (None, ""):
            if "*" not in policy.allowed_toleration_keys:
                out.append(
                    Violation(
                        f"{where}.key", f"required (an empty key tolerates every taint; {allowed})"
                    )
                )
        elif not key_allowed(key, policy.allowed_toleration_keys):
            out.append(Violation(f"{where}.key", f"toleration key not allowed ({allowed})"))
        if t.get("operator") not in (None, "Equal", "Exists"):
            out.append(Violation(f"{where}.operator", "allowed: Equal, Exists"))
        if t.get("effect") not in (None, "", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            out.append(
                Violation(f"{where}.effect", "allowed: NoSchedule, PreferNoSchedule, NoExecute")
            )
    return out


def check_selector_keys(keys: Iterable[Any], where: str, policy: PodPolicy) -> list[Violation]:
    allowed = allowed_text(policy.allowed_node_selector_keys, "node label key")
    return [
        Violation(where, f"node label key not allowed ({allowed})")
        for k in keys
        if not key_allowed(k, policy.allowed_node_selector_keys)
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
        out += unknown_keys(term, {"matchExpressions", "matchFields"}, tw)
        if term.get("matchFields"):
            out.append(Violation(f"{tw}.matchFields", "not allowed (it pins node names)"))
        for k, expr in enumerate(term.get("matchExpressions") or []):
            key = expr.get("key") if isinstance(expr, Mapping) else None
            out += check_selector_keys([key], f"{tw}.matchExpressions[{k}].key", policy)
    return out


def check_affinity(aff: Any, policy: PodPolicy) -> list[Violation]:
    where = "spec.podTemplate.affinity"
    if aff is None:
        return []
    if not isinstance(aff, Mapping):
        return [Violation(where, "expected an object")]
    out = unknown_keys(aff, {"nodeAffinity", "podAntiAffinity"}, where)
    na = aff.get("nodeAffinity")
    if na is not None:
        if not isinstance(na, Mapping):
            return [*out, Violation(f"{where}.nodeAffinity", "expected an object")]
        nw = f"{where}.nodeAffinity"
        req_key = "requiredDuringSchedulingIgnoredDuringExecution"
        pref_key = "preferredDuringSchedulingIgnoredDuringExecution"
        out += unknown_keys(na, {req_key, pref_key}, nw)
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


def check_node_selector(sel: Any, policy: PodPolicy) -> list[Violation]:
    """``podTemplate.nodeSelector``: at most :data:`MAX_SELECTOR` keys, each allowed."""
    if sel is None:
        return []
    if not isinstance(sel, Mapping) or len(sel) > MAX_SELECTOR:
        return [Violation("spec.podTemplate.nodeSelector", f"at most {MAX_SELECTOR} keys")]
    out: list[Violation] = []
    for key in sel:
        out += check_selector_keys([key], f"spec.podTemplate.nodeSelector[{quote(key)}]", policy)
    return out


def check_priority_class(pc: Any, policy: PodPolicy) -> list[Violation]:
    """``podTemplate.priorityClassName``: in ``allowedPriorityClasses``; ``system-*`` only when
    listed exactly."""
    if pc is None:
        return []
    ok = allowed_name(pc, policy.allowed_priority_classes)
    if isinstance(pc, str) and pc.startswith("system-"):
        ok = pc in policy.allowed_priority_classes
    if ok:
        return []
    allowed = allowed_text(policy.allowed_priority_classes, "priorityClassName")
    return [
        Violation(
            "spec.podTemplate.priorityClassName",
            f"priority class not allowed ({allowed}; system-* only when listed exactly)",
        )
    ]
