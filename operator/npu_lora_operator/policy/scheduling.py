"""Where the pod may run: tolerations, nodeSelector, affinity, priority class."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from npu_lora_operator.messages import quote
from npu_lora_operator.policy.common import (
    allowed_name,
    allowed_text,
    key_allowed,
    label_value,
    unknown_keys,
)
from npu_lora_operator.policy.config import PodPolicy, Violation

_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
MAX_TOLERATIONS = 32
MAX_SELECTOR = 32
_INT64_MAX = 2**63 - 1
_NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


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
        if t.get("value") is not None and not label_value(t.get("value")):
            out.append(Violation(f"{where}.value", "must be a label value (63 characters)"))
        secs = t.get("tolerationSeconds")
        if secs is not None and (
            isinstance(secs, bool) or not isinstance(secs, int) or not 0 <= secs <= _INT64_MAX
        ):
            out.append(Violation(f"{where}.tolerationSeconds", "a non-negative 64-bit integer"))
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
            out += _expression(expr, f"{tw}.matchExpressions[{k}]", policy)
    return out


def _expression(expr: Any, where: str, policy: PodPolicy) -> list[Violation]:
    """One node selector requirement: an allowed key, a known operator, label values."""
    if not isinstance(expr, Mapping):
        return [Violation(where, "expected an object {key, operator, values}")]
    out = unknown_keys(expr, {"key", "operator", "values"}, where)
    out += check_selector_keys([expr.get("key")], f"{where}.key", policy)
    if expr.get("operator") not in _NODE_OPERATORS:
        out.append(Violation(f"{where}.operator", f"allowed: {', '.join(_NODE_OPERATORS)}"))
    values = expr.get("values") or []
    if not isinstance(values, list) or len(values) > MAX_SELECTOR:
        out.append(Violation(f"{where}.values", f"a list of at most {MAX_SELECTOR} label values"))
    elif not all(label_value(v) for v in values):
        out.append(Violation(f"{where}.values", "each must be a label value (63 characters)"))
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
        out += unknown_keys(na, {_REQUIRED, _PREFERRED}, nw)
        req = na.get(_REQUIRED)
        if req is not None:
            req = req if isinstance(req, Mapping) else {}
            out += unknown_keys(req, {"nodeSelectorTerms"}, f"{nw}.{_REQUIRED}")
            terms = req.get("nodeSelectorTerms")
            tw = f"{nw}.{_REQUIRED}.nodeSelectorTerms"
            if not terms:
                out.append(Violation(tw, "required: at least one term"))
            out += _node_terms(terms or [], tw, policy)
        for j, p in enumerate(na.get(_PREFERRED) or []):
            pw = f"{nw}.{_PREFERRED}[{j}]"
            p = p if isinstance(p, Mapping) else {}
            out += unknown_keys(p, {"weight", "preference"}, pw)
            w = p.get("weight")
            if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 100:
                out.append(Violation(f"{pw}.weight", "an integer from 1 to 100"))
            out += _node_terms([p.get("preference") or {}], f"{pw}.preference", policy)
    anti = aff.get("podAntiAffinity")
    if anti is not None:
        if not isinstance(anti, Mapping):
            return [*out, Violation(f"{where}.podAntiAffinity", "expected an object")]
        out += unknown_keys(anti, {_REQUIRED, _PREFERRED}, f"{where}.podAntiAffinity")
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
    for key, value in sel.items():
        where = f"spec.podTemplate.nodeSelector[{quote(key)}]"
        out += check_selector_keys([key], where, policy)
        if not label_value(value):
            out.append(Violation(where, "the value must be a label value (63 characters)"))
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
