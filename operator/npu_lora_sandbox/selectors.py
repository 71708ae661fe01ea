"""Label and field selectors of list/watch requests."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .resources import ApiError

#: a label key: an optional DNS-subdomain prefix and ``/``, then a name (lengths checked apart)
_KEY = (
    r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_NOT_EXISTS = re.compile(rf"\s*!\s*({_KEY})\s*")
_EXISTS = re.compile(rf"\s*({_KEY})\s*")
_EQUALITY = re.compile(rf"\s*({_KEY})\s*(==|!=|=)\s*({_VALUE})\s*")
_SET = re.compile(rf"\s*({_KEY})\s+(in|notin)\s*\(([^()]*)\)\s*")
_NUMERIC = re.compile(rf"\s*({_KEY})\s*([<>])\s*(-?[0-9]+)\s*")
_VALUE_RE = re.compile(_VALUE)


def _bad_selector(kind: str, text: str, why: str) -> ApiError:
    """400, as the API server answers a selector it cannot parse."""
    return ApiError(400, "BadRequest", f"unable to parse requirement: {kind} {text[:256]!r}: {why}")


def _key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return len(name) <= 63 and len(prefix) <= 253


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
            if depth > 1:
                raise _bad_selector("label selector", text, "nested '('")
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise _bad_selector("label selector", text, "unbalanced ')'")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise _bad_selector("label selector", text, "unbalanced '('")
    parts.append(cur)
    return parts


def _label_requirement(part: str, text: str) -> Callable[[dict[str, str]], bool]:
    """One requirement of a label selector (the API server's grammar: ``k``, ``!k``, ``k=v``,
    ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k>1``, ``k<1``; keys are label
    keys, values label values)."""
    if m := _NOT_EXISTS.fullmatch(part):
        k = m.group(1)
        if _key_ok(k):
            return lambda lb: k not in lb
    elif m := _EQUALITY.fullmatch(part):
        k, op, v = m.groups()
        if _key_ok(k) and len(v) <= 63:
            if op == "!=":
                return lambda lb: lb.get(k) != v
            return lambda lb: lb.get(k) == v
    elif m := _SET.fullmatch(part):
        k, op, vals = m.groups()
        values = [x.strip() for x in vals.split(",")]
        if not _key_ok(k) or not [x for x in values if x]:
            raise _bad_selector("label selector", text, f"{op} needs at least one value")
        if all(_VALUE_RE.fullmatch(x) and len(x) <= 63 for x in values):
            vs = set(values)
            if op == "in":
                return lambda lb: lb.get(k) in vs
            return lambda lb: lb.get(k) not in vs
    elif m := _NUMERIC.fullmatch(part):
        k, op, n = m.group(1), m.group(2), int(m.group(3))
        if _key_ok(k):

            def compare(lb: dict[str, str]) -> bool:
                try:
                    v = int(lb[k])
                except (KeyError, ValueError):
                    return False
                return v > n if op == ">" else v < n

            return compare
    elif m := _EXISTS.fullmatch(part):
        k = m.group(1)
        if _key_ok(k):
            return lambda lb: k in lb
    raise _bad_selector("label selector", text, f"invalid requirement {part.strip()[:128]!r}")


def parse_label_selector(text: str | None) -> Callable[[dict[str, str]], bool]:
    """A label selector's matcher; ``ApiError`` 400 for one the API server would refuse."""
    if not text:
        return lambda labels: True
    reqs = [_label_requirement(part, text) for part in _split_selector(text)]
    return lambda labels: all(r(labels) for r in reqs)


def _dotted(obj: Any, path: str) -> str:
    node = obj
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return "" if node is None else str(node)


_FIELD_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


def _split_unescaped(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` not escaped with a backslash (escapes kept)."""
    parts, cur, i = [], "", 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur += text[i : i + 2]
            i += 2
            continue
        if ch == sep:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    parts.append(cur)
    return parts


def _unescape(value: str, text: str) -> str:
    out, i = "", 0
    while i < len(value):
        if value[i] == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=!":
                raise _bad_selector("field selector", text, "invalid escape sequence")
            out += value[i + 1]
            i += 2
            continue
        if value[i] in ",=" or value[i : i + 2] == "!=":
            raise _bad_selector("field selector", text, "unescaped '=' or ',' in a value")
        out += value[i]
        i += 1
    return out


def parse_field_selector(text: str | None) -> Callable[[dict[str, Any]], bool]:
    """A field selector's matcher (``f=v``, ``f==v``, ``f!=v``, comma-separated, ``\\``
    escapes); ``ApiError`` 400 for one the API server cannot parse."""
    if not text:
        return lambda obj: True
    reqs: list[Callable[[dict[str, Any]], bool]] = []
    for part in _split_unescaped(text, ","):
        m = re.fullmatch(r"\s*([^=!\s]*)\s*(!=|==|=)(.*)", part)
        if m is None:
            raise _bad_selector("field selector", text, f"can't understand {part[:128]!r}")
        k, op, raw_value = m.groups()
        if not _FIELD_KEY.fullmatch(k):
            raise _bad_selector("field selector", text, f"invalid field {k[:128]!r}")
        v = _unescape(raw_value, text)
        if op == "!=":
            reqs.append(lambda o, k=k, v=v: _dotted(o, k) != v)
        else:
            reqs.append(lambda o, k=k, v=v: _dotted(o, k) == v)
    return lambda obj: all(r(obj) for r in reqs)


#: the fields a list/watch may select on, per built-in resource, beyond ``metadata.name`` and
#: ``metadata.namespace`` (the API server's field label conversion functions); resources not
#: listed here accept any field
FIELD_LABELS: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        }
    ),
    ("", "events"): frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    ("", "secrets"): frozenset({"type"}),
    ("", "configmaps"): frozenset(),
    ("", "serviceaccounts"): frozenset(),
    ("", "persistentvolumeclaims"): frozenset(),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("", "nodes"): frozenset({"spec.unschedulable"}),
    ("batch", "jobs"): frozenset({"status.successful"}),
    ("rbac.authorization.k8s.io", "roles"): frozenset(),
    ("rbac.authorization.k8s.io", "rolebindings"): frozenset(),
    ("rbac.authorization.k8s.io", "clusterroles"): frozenset(),
    ("rbac.authorization.k8s.io", "clusterrolebindings"): frozenset(),
}
_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


def check_field_labels(text: str | None, allowed: frozenset[str] | None, kind: str) -> None:
    """400 for a field selector on a field the resource cannot select on (``allowed``: its
    fields beyond metadata.name/namespace; None: any)."""
    if not text or allowed is None:
        return
    for part in _split_unescaped(text, ","):
        m = re.fullmatch(r"\s*([^=!\s]*)\s*(!=|==|=)(.*)", part)
        field = m.group(1) if m else part
        if field not in _META_FIELDS and field not in allowed:
            raise ApiError(
                400,
                "BadRequest",
                f'field label not supported: "{field[:128]}" (for {kind}: '
                f"{', '.join(sorted(_META_FIELDS | allowed))})",
            )


def _int_param(q: Any, name: str, *, minimum: int | None = None) -> None:
    value = q.get(name)
    if value is None or value == "":
        return
    try:
        n = int(value, 10)
    except ValueError:
        raise ApiError(
            400, "BadRequest", f"{name}: invalid value {value[:64]!r}: expected an integer"
        ) from None
    if minimum is not None and n < minimum:
        raise ApiError(400, "BadRequest", f"{name}: must be at least {minimum}, got {n}")


def check_list_query(q: Any) -> None:
    """The query of a list or watch, checked before anything is answered (a watch stream
    never starts for a bad one): integer ``timeoutSeconds``/``limit``, a resourceVersion the
    server issued (digits), known ``resourceVersionMatch``, parseable selectors. 400 else."""
    _int_param(q, "timeoutSeconds")
    _int_param(q, "limit", minimum=0)
    rv = q.get("resourceVersion")
    if rv and not rv.isdigit():
        raise ApiError(400, "BadRequest", f"invalid resource version {rv[:64]!r}")
    match = q.get("resourceVersionMatch")
    if match and match not in ("Exact", "NotOlderThan"):
        raise ApiError(
            400,
            "BadRequest",
            f"resourceVersionMatch: unsupported value {match[:64]!r} (Exact, NotOlderThan)",
        )
    parse_label_selector(q.get("labelSelector"))
    parse_field_selector(q.get("fieldSelector"))


#: the values the API server accepts for a write's options (anything else: 422 Invalid)
_WRITE_OPTIONS = {
    "dryRun": ("All",),
    "fieldValidation": ("Ignore", "Warn", "Strict"),
    "propagationPolicy": ("Orphan", "Background", "Foreground"),
}


def check_write_query(q: Any, method: str) -> None:
    """The options of a create, update, patch or delete, checked before anything changes: an
    unknown ``dryRun`` (a typo must never write for real), ``fieldValidation`` or
    ``propagationPolicy`` value is a 422 as the API server's options validation gives, a
    non-integer ``gracePeriodSeconds`` a 400."""
    kind = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions"}.get(
        method, "DeleteOptions"
    )
    for name, allowed in _WRITE_OPTIONS.items():
        if name == "propagationPolicy" and method != "DELETE":
            continue
        if name == "fieldValidation" and method == "DELETE":
            continue
        values = q.getall(name, []) if hasattr(q, "getall") else [q.get(name)]
        for v in values:
            if not v or v in allowed:
                continue
            raise ApiError(
                422,
                "Invalid",
                f'{kind}.meta.k8s.io "" is invalid: {name}: Unsupported value: {v[:64]!r}: '
                f"supported values: {', '.join(repr(a) for a in allowed)}",
            )
    if method == "DELETE":
        _int_param(q, "gracePeriodSeconds")


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1", "yes")
